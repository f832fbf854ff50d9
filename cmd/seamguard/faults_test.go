package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"testing"
	"text/tabwriter"
	"time"
)

// The fault suite: every test named TestFault* breaks one promise on
// purpose (a power cut, a network partition, a paused process, partitions
// handed back and forth) and checks the books afterwards. Each records one
// row per fault and setting; the table is printed when the test binary
// ends. The short size runs in CI; the full size is one command:
//
//	SEAMGUARD_LONG=1 go test ./cmd/seamguard -run TestFault -faults=full -v -timeout 60m
//
// Tests that need root, /dev/fuse or network namespaces skip, saying why,
// where those are missing.
var faultsSize = flag.String("faults", "short", "size of the fault suite (TestFault*): short (runs in CI) or full")

// faultRow is one line of the fault suite's table.
type faultRow struct {
	Fault   string // what was done, e.g. "power cut, single server"
	Setting string // "lazy" (the server syncs every 2m) or "durable" (sync_interval: always)
	Acked   int    // events acknowledged to the agents
	Lost    int    // acknowledged events missing from the events stream afterwards
	// Verdicts a subscriber received (or an undisturbed run published) that
	// are missing from the verdict stream afterwards.
	VerdictsLost int
	Different    int // verdicts whose body differs from an undisturbed run's
	Duplicated   int // requests decided more than once, or verdict ids stored twice
	// Spill handles handed out that do not read back with their digest.
	SpillsUnreadable int
	Recovery         time.Duration // from the fault's end (or the restart) to every input decided
	Note             string
}

var faultTable struct {
	sync.Mutex
	rows []faultRow
}

// reportFault adds a row to the fault suite's table.
func reportFault(t testing.TB, r faultRow) {
	t.Helper()
	t.Logf("fault %q (%s): acked %d, lost %d, verdicts lost %d, different %d, duplicated %d, spills unreadable %d, recovery %s %s",
		r.Fault, r.Setting, r.Acked, r.Lost, r.VerdictsLost, r.Different, r.Duplicated, r.SpillsUnreadable, r.Recovery.Round(time.Millisecond), r.Note)
	faultTable.Lock()
	faultTable.rows = append(faultTable.rows, r)
	faultTable.Unlock()
}

// printFaultTable writes the table of every row recorded, if any.
func printFaultTable(w io.Writer) {
	faultTable.Lock()
	defer faultTable.Unlock()
	if len(faultTable.rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\nfault suite (%s size)\n", *faultsSize)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "fault\tsetting\tacked\tlost\tverdicts lost\tdifferent\tduplicated\tspills unreadable\trecovery\tnote")
	for _, r := range faultTable.rows {
		rec := "-"
		if r.Recovery > 0 {
			rec = r.Recovery.Round(10 * time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", r.Fault, r.Setting, r.Acked, r.Lost, r.VerdictsLost,
			r.Different, r.Duplicated, r.SpillsUnreadable, rec, r.Note)
	}
	tw.Flush()
}

// needRoot skips t unless this process is root and every tool named is
// on the PATH (e.g. "ip", "iptables"), and /dev/fuse exists when fuse is
// set.
func needRoot(t *testing.T, fuse bool, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts a FUSE filesystem or makes network namespaces); run the suite as root")
	}
	if fuse {
		if _, err := os.Stat("/dev/fuse"); err != nil {
			t.Skipf("needs /dev/fuse: %v", err)
		}
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s on the PATH: %v", tool, err)
		}
	}
}
