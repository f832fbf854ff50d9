package dirlock

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// holdEnv makes the test binary a process that takes the directory it
// names, prints "held", and holds it until killed.
const holdEnv = "DIRLOCK_TEST_HOLD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(holdEnv); dir != "" {
		l, err := Acquire(dir, Self("nats 127.0.0.1:4999"))
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println("held")
		_ = l
		select {}
	}
	os.Exit(m.Run())
}

func TestSecondAcquireRefusedAtOnce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	first, err := Acquire(dir, Self("nats 127.0.0.1:4222", "health 127.0.0.1:8080"))
	require.NoError(t, err)

	b, err := os.ReadFile(filepath.Join(dir, FileName))
	require.NoError(t, err)
	require.Contains(t, string(b), `"pid":`+strconv.Itoa(os.Getpid()))
	require.Contains(t, string(b), "127.0.0.1:4222")

	start := time.Now()
	second, err := Acquire(dir, Self("nats 127.0.0.1:4223"))
	require.Nil(t, second)
	require.Less(t, time.Since(start), time.Second, "a refusal does not wait")
	require.ErrorIs(t, err, ErrLocked)
	var le *LockedError
	require.ErrorAs(t, err, &le)
	require.Equal(t, os.Getpid(), le.Holder.PID)
	require.Equal(t, []string{"nats 127.0.0.1:4222", "health 127.0.0.1:8080"}, le.Holder.Listen)
	require.Contains(t, err.Error(), "pid "+strconv.Itoa(os.Getpid()))
	require.Contains(t, err.Error(), "listening on nats 127.0.0.1:4222 and health 127.0.0.1:8080")
	require.Contains(t, err.Error(), "since ")

	require.NoError(t, first.Update(Self("nats 127.0.0.1:5555")))
	_, err = Acquire(dir, Holder{})
	require.ErrorContains(t, err, "nats 127.0.0.1:5555")

	require.NoError(t, first.Release())
	third, err := Acquire(dir, Self())
	require.NoError(t, err, "a released directory can be taken")
	require.NoError(t, third.Release())
}

func TestKilledHolderReleases(t *testing.T) {
	if !kernelLock {
		t.Skip("without flock a killed holder leaves its lock file")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holdEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line, _ := bufio.NewReader(out).ReadString('\n')
	require.Equal(t, "held", strings.TrimSpace(line))

	_, err = Acquire(dir, Self())
	var le *LockedError
	require.ErrorAs(t, err, &le)
	require.Equal(t, cmd.Process.Pid, le.Holder.PID, "the refusal names the other process")
	require.Equal(t, []string{"nats 127.0.0.1:4999"}, le.Holder.Listen)

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	l, err := Acquire(dir, Self())
	require.NoError(t, err, "a holder killed with SIGKILL leaves the directory free")
	require.NoError(t, l.Release())
}

func TestLockedErrorWithoutHolder(t *testing.T) {
	err := error(&LockedError{Dir: "/d"})
	require.True(t, errors.Is(err, ErrLocked))
	require.Equal(t, "dirlock: /d is in use by a process that has not written who it is", err.Error())
	err = &LockedError{Dir: "/d", Holder: Holder{PID: 7}, Stale: true}
	require.Contains(t, err.Error(), "remove /d/LOCK")
}
