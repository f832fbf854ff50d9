package main

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHelp: every command's -h, --help and `seamguard help CMD` print its
// usage to standard output and exit 0; `help` names a command it does not
// know, and lists those it does.
func TestHelp(t *testing.T) {
	names := commandNames()
	require.Contains(t, names, "version")
	for _, name := range names {
		for _, args := range [][]string{{name, "-h"}, {name, "--help"}, {"help", name}} {
			code, out, errs := runCLI(t, "", args...)
			assert.Equal(t, 0, code, "%v: %s", args, errs)
			assert.Empty(t, errs, "%v: help goes to standard output", args)
			assert.True(t, strings.HasPrefix(out, "usage: seamguard "+name), "%v:\n%s", args, out)
			assert.NotContains(t, out, "help requested", "%v", args)
		}
	}
	// spill's only subcommand is get: spill -h is its help too.
	for _, args := range [][]string{{"spill", "-h"}, {"spill", "get", "--help"}} {
		code, out, errs := runCLI(t, "", args...)
		assert.Equal(t, 0, code, "%v: %s", args, errs)
		assert.Contains(t, out, "usage: seamguard spill get NAME", "%v", args)
		assert.Contains(t, out, "-force", "%v", args)
	}
	// A command's help after other flags and arguments is still its help.
	code, out, _ := runCLI(t, "", "inspect", "some-session", "--json", "-h")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "usage: seamguard inspect SESSION")

	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		code, out, errs := runCLI(t, "", args...)
		assert.Equal(t, 0, code, "%v", args)
		assert.Empty(t, errs, "%v", args)
		for _, name := range names {
			assert.Contains(t, out, "\n  "+name+" ", "%v", args)
		}
	}

	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, []string{"usage: seamguard <command>"}},
		{[]string{"help", "nosuch"}, []string{`no command "nosuch"; the commands are ` + strings.Join(names, ", ")}},
		{[]string{"help", "serve", "watch"}, []string{"give one command"}},
		{[]string{"help", "x\x1b[2J"}, []string{`no command "x\x1b[2J"`}},
		{[]string{"watch", "--nope"}, []string{"flag provided but not defined: -nope", "run 'seamguard watch -h' for its flags"}},
		{[]string{"spill", "put"}, []string{"use: seamguard spill get NAME"}},
	} {
		code, out, errs := runCLI(t, "", tc.args...)
		assert.Equal(t, 2, code, "%v: %s", tc.args, errs)
		assert.Empty(t, out, "%v", tc.args)
		for _, w := range tc.want {
			assert.Contains(t, errs, w, "%v", tc.args)
		}
		assert.NotContains(t, errs, "\x1b", "%v", tc.args)
	}
}

// TestHelpFlagsBounded reads every command's help: no numeric flag is
// registered without bounds (a plain fs.Int or fs.Duration shows as
// "int" or "duration" with no range), and each bounded one says its range.
func TestHelpFlagsBounded(t *testing.T) {
	entry := regexp.MustCompile(`(?m)^  -([a-z0-9-]+)(?: (\S+))?\n((?:    \t.*\n?)*)`)
	bounded := 0
	for _, name := range commandNames() {
		code, out, errs := runCLI(t, "", name, "-h")
		require.Equal(t, 0, code, errs)
		for _, m := range entry.FindAllStringSubmatch(out, -1) {
			flagName, placeholder, usage := m[1], m[2], m[3]
			switch {
			case placeholder == "int" || placeholder == "int64" || placeholder == "uint" || placeholder == "uint64" || placeholder == "float":
				t.Errorf("seamguard %s --%s is a number without bounds: register it with ints, durations or sizes (flags.go)", name, flagName)
			case placeholder == "duration" && !strings.Contains(usage, "(duration: "):
				t.Errorf("seamguard %s --%s is a duration without bounds: register it with durations (flags.go)", name, flagName)
			case regexp.MustCompile(`\((number|duration|size): .+ to .+\)`).MatchString(usage):
				bounded++
			}
		}
	}
	assert.GreaterOrEqual(t, bounded, 30, "the commands' numeric flags, with their ranges in the help")
}

// TestFlagBounds: a numeric flag out of its range, on the command line or
// from its environment variable, is a usage error that names the flag, the
// range and what 0 means, before anything starts or connects.
func TestFlagBounds(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"inspect", "s", "--width", "2000000000"}, nil, `invalid value "2000000000" for flag -width: out of range; use 16 to 1000, or 0 for the default, 64`},
		{[]string{"inspect", "s", "--width", "15"}, nil, "flag -width: out of range"},
		{[]string{"inspect", "s", "--width", "-1"}, nil, "flag -width: out of range"},
		{[]string{"inspect", "s", "--width", "wide"}, nil, `invalid value "wide" for flag -width: not a whole number; use 16 to 1000`},
		{[]string{"inspect", "s"}, map[string]string{"SEAMGUARD_WIDTH": "100000"}, `SEAMGUARD_WIDTH="100000": out of range; use 16 to 1000`},
		{[]string{"inspect", "s", "--max-snapshot-bytes", "65MiB"}, nil, "flag -max-snapshot-bytes: out of range; use 4KiB to 64MiB, or 0 for the default"},
		{[]string{"watch", "--max", "-1"}, nil, `invalid value "-1" for flag -max: out of range; use 1 to 1000000000, or 0 for no limit (until interrupted)`},
		{[]string{"watch"}, map[string]string{"SEAMGUARD_MAX": "-1"}, `SEAMGUARD_MAX="-1": out of range`},
		{[]string{"watch", "--connect-timeout", "0s"}, nil, "flag -connect-timeout: out of range; use 100ms to 10m"},
		{[]string{"watch", "--connect-timeout", "-5s"}, nil, "flag -connect-timeout: out of range"},
		{[]string{"watch"}, map[string]string{"SEAMGUARD_CONNECT_TIMEOUT": "0"}, `SEAMGUARD_CONNECT_TIMEOUT="0": out of range; use 100ms to 10m`},
		{[]string{"spill", "get", "s/1.jsonl", "--connect-timeout", "11m"}, nil, "flag -connect-timeout: out of range"},
		{[]string{"replay", "--max-requests", "100"}, nil, "flag -max-requests: out of range; use 256 to 1000000, or 0 for the default"},
		{[]string{"resume", "s", "--note", "x", "--connect-timeout", "1ms"}, nil, "flag -connect-timeout: out of range"},
		{[]string{"check", "--max-ranges", "-1"}, nil, "flag -max-ranges: out of range; use 1 to 10000000, or 0 for the default"},
		{[]string{"check", "--spill-quota", "1KiB"}, nil, "flag -spill-quota: out of range; use 1MiB to 1PiB, or 0 for the default"},
		{[]string{"demo", "--timeout", "0s"}, nil, "flag -timeout: out of range; use 1s to 1h"},
		{[]string{"serve", "--shards", "0"}, nil, "flag -shards: out of range; use 1 to 1024"},
		{[]string{"serve", "--shards", "5000"}, nil, "flag -shards: out of range"},
		{[]string{"serve", "--replicas", "6"}, nil, "flag -replicas: out of range; use 1 to 5, or 0 for 3 on a cluster of 3 or more servers, else 1"},
		{[]string{"serve", "--partitions", "2000"}, nil, "flag -partitions: out of range; use 1 to 1024"},
		{[]string{"serve", "--lease-ttl", "500ms"}, nil, "flag -lease-ttl: out of range; use 1s to 1h"},
		{[]string{"serve", "--pinned-ttl", "2h"}, nil, "flag -pinned-ttl: out of range"},
		{[]string{"serve", "--events-max-age", "0"}, nil, "flag -events-max-age: out of range; use 1m to 3650d"},
		{[]string{"serve", "--events-max-age", "4000d"}, nil, "flag -events-max-age: out of range"},
		{[]string{"serve", "--events-max-age", "20y"}, nil, "flag -events-max-age: not a duration such as 90s, 15m, 48h or 7d"},
		{[]string{"serve", "--verdicts-max-age", "30s"}, nil, "flag -verdicts-max-age: out of range; use 1m to 3650d, or 0 for forever"},
		{[]string{"serve", "--ack-wait", "0s"}, nil, "flag -ack-wait: out of range; use 1s to 1h"},
		{[]string{"serve", "--retry-for", "-1s"}, nil, "flag -retry-for: out of range"},
		{[]string{"serve", "--start-timeout", "0s"}, nil, "flag -start-timeout: out of range"},
		{[]string{"serve", "--drain-timeout", "2h"}, nil, "flag -drain-timeout: out of range"},
		{[]string{"serve", "--sweep-every", "0s"}, nil, "flag -sweep-every: out of range; use 1s to 24h, or a negative value for never"},
		{[]string{"serve", "--sweep-every", "48h"}, nil, "flag -sweep-every: out of range"},
		{[]string{"serve", "--sweep-min-age", "1s"}, nil, "flag -sweep-min-age: out of range; use 2s to 24h"},
		{[]string{"serve", "--max-sessions", "0"}, nil, "flag -max-sessions: out of range; use 1 to 100000000"},
		{[]string{"serve", "--max-ranges", "20000000"}, nil, "flag -max-ranges: out of range"},
		{[]string{"serve", "--max-snapshot-bytes", "1KiB"}, nil, "flag -max-snapshot-bytes: out of range"},
		{[]string{"serve", "--spill-bucket-max-bytes", "1KiB"}, nil, "flag -spill-bucket-max-bytes: out of range; use 1MiB to 1EiB, or 0 for no limit but the server's storage"},
		{[]string{"serve", "--lag-interval", "10ms"}, nil, "flag -lag-interval: out of range; use 100ms to 1h"},
		{[]string{"serve"}, map[string]string{"SEAMGUARD_SHARDS": "0"}, `SEAMGUARD_SHARDS="0": out of range`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			start := time.Now()
			code, out, errs := runCLI(t, "", tc.args...)
			assert.Equal(t, 2, code, errs)
			assert.Empty(t, out)
			assert.Contains(t, errs, tc.want)
			assert.Contains(t, errs, "run 'seamguard "+tc.args[0]+" -h' for its flags")
			assert.Less(t, time.Since(start), 2*time.Second, "nothing is started or dialled")
		})
	}
}

// TestBoundedValues: what the bounded flags accept, and how they show it.
func TestBoundedValues(t *testing.T) {
	var n int
	f := ints(&n, 64, 16, 1000).orZero("the default")
	assert.Equal(t, 64, n, "set to its default")
	for in, want := range map[string]int{"16": 16, "1000": 1000, "0": 0, " 200 ": 200, "0x20": 32} {
		require.NoError(t, f.Set(in), in)
		assert.Equal(t, want, n, in)
	}
	for _, in := range []string{"15", "1001", "-1", "1e3", "", "99999999999999999999"} {
		assert.Error(t, f.Set(in), in)
	}
	assert.Error(t, ints(&n, 1, 1, 5).Set("0"), "0 is out of range unless it means something")

	var d time.Duration
	df := durations(&d, time.Minute, time.Second, 3650*24*time.Hour)
	for in, want := range map[string]time.Duration{"7d": 7 * 24 * time.Hour, "90s": 90 * time.Second, "1s": time.Second, "3650d": 3650 * 24 * time.Hour} {
		require.NoError(t, df.Set(in), in)
		assert.Equal(t, want, d, in)
	}
	for _, in := range []string{"0", "-1s", "999ms", "3651d", "7", "d", "-1d", "99999999999d"} {
		assert.Error(t, df.Set(in), in)
	}
	neg := durations(&d, time.Minute, time.Second, time.Hour).orNegative("never")
	require.NoError(t, neg.Set("-1s"))
	assert.Equal(t, -time.Second, d)
	assert.Error(t, neg.Set("0"))

	var s int64
	sf := sizes(&s, 1<<20, 4<<10, 64<<20).orZero("the default")
	for in, want := range map[string]int64{"64MiB": 64 << 20, "4096": 4096, "512k": 512 << 10, "0": 0} {
		require.NoError(t, sf.Set(in), in)
		assert.Equal(t, want, s, in)
	}
	for _, in := range []string{"4095", "65MiB", "1GiB", "-1", "lots", "9EiB"} {
		assert.Error(t, sf.Set(in), in)
	}

	for d, want := range map[time.Duration]string{0: "0", 100 * time.Millisecond: "100ms", 90 * time.Second: "1m30s", 10 * time.Minute: "10m",
		time.Hour: "1h", 36 * time.Hour: "36h", 7 * 24 * time.Hour: "7d", 90 * time.Minute: "1h30m", -time.Second: "-1s"} {
		assert.Equal(t, want, formatDuration(d))
		back, err := parseDuration(want)
		require.NoError(t, err)
		assert.Equal(t, d, back, want)
	}
	for n, want := range map[int64]string{0: "0", 1000: "1000", 4 << 10: "4KiB", 512 << 10: "512KiB", 1 << 30: "1GiB", 1 << 50: "1PiB", 1 << 60: "1EiB", 3 << 20: "3MiB"} {
		assert.Equal(t, want, formatSize(n))
		back, err := parseSize(want)
		require.NoError(t, err)
		assert.Equal(t, n, back, want)
	}

	// The help shows the range once, however often the flags are parsed.
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Var(ints(&n, 0, 16, 1000), "width", "the `cells`")
	fs.Var(durations(&d, time.Second, time.Second, time.Hour), "wait", "how long")
	describeBounds(fs)
	describeBounds(fs)
	assert.Equal(t, "the `cells` (number: 16 to 1000)", fs.Lookup("width").Usage)
	assert.Equal(t, "how long (`duration`: 1s to 1h)", fs.Lookup("wait").Usage)
}

// TestPasswordFlagWarns: --password on the command line works as before,
// with a warning that names SEAMGUARD_PASSWORD; from the variable, none.
func TestPasswordFlagWarns(t *testing.T) {
	// --password needs --user: the check fails after the flags are read,
	// before anything connects.
	code, _, errs := runCLI(t, "", "watch", "--password", "secret")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "seamguard watch: warning: --password on the command line shows in ps and in the shell's history; set SEAMGUARD_PASSWORD instead")
	assert.Contains(t, errs, "--password needs --user")

	t.Setenv("SEAMGUARD_PASSWORD", "secret")
	code, _, errs = runCLI(t, "", "watch")
	assert.Equal(t, 2, code)
	assert.NotContains(t, errs, "warning")
	assert.Contains(t, errs, "--password needs --user", "the variable is read")

	code, out, _ := runCLI(t, "", "serve", "-h")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "NATS password; prefer the environment variable SEAMGUARD_PASSWORD: a command line shows in ps")
}

// TestVersion: version and --version print the module, its version and the
// Go version.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errs := runCLI(t, "", args...)
		require.Equal(t, 0, code, errs)
		assert.True(t, strings.HasPrefix(out, "seamguard "), out)
		assert.Contains(t, out, "\nmodule: github.com/seamguard/seamguard\n")
		assert.Contains(t, out, "\nrevision: ")
		assert.Contains(t, out, "\ngo: "+runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH+"\n")
	}
	code, _, errs := runCLI(t, "", "version", "extra")
	assert.Equal(t, 2, code)
	assert.Contains(t, errs, "version takes no arguments")
}

func TestVersionText(t *testing.T) {
	platform := runtime.GOOS + "/" + runtime.GOARCH
	build := func(version string, settings ...string) *debug.BuildInfo {
		info := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/seamguard/seamguard", Version: version}}
		for i := 0; i < len(settings); i += 2 {
			info.Settings = append(info.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
		}
		return info
	}
	for _, tc := range []struct {
		name string
		info *debug.BuildInfo
		ok   bool
		want string
	}{
		{"go install path@version", build("v1.4.0", "vcs", "git", "vcs.revision", "0123456789abcdef0123456789abcdef01234567", "vcs.time", "2026-11-02T10:00:00Z", "vcs.modified", "false"), true,
			"seamguard v1.4.0\nmodule: github.com/seamguard/seamguard\nrevision: 0123456789abcdef0123456789abcdef01234567\ncommitted: 2026-11-02T10:00:00Z\ngo: go1.26.8 " + platform + "\n"},
		{"go build in a modified checkout", build("(devel)", "vcs.revision", "abc123", "vcs.time", "2026-11-02T10:00:00Z", "vcs.modified", "true"), true,
			"seamguard (devel)\nmodule: github.com/seamguard/seamguard\nrevision: abc123 (modified: the working tree had uncommitted changes)\ncommitted: 2026-11-02T10:00:00Z\ngo: go1.26.8 " + platform + "\n"},
		{"no VCS information", build("(devel)"), true,
			"seamguard (devel)\nmodule: github.com/seamguard/seamguard\nrevision: unknown (built without VCS information: not with go build in a git checkout, or with -buildvcs=false)\ngo: go1.26.8 " + platform + "\n"},
		{"no build information", nil, false,
			"seamguard: no build information in this binary\ngo: " + runtime.Version() + " " + platform + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, versionText(tc.info, tc.ok))
		})
	}
}

// TestSpillGetOutputFile: spill get -o leaves a file that holds exactly
// the transcript as it is (the command can be run again), and refuses any
// other existing file or symbolic link (without following it) unless
// --force, which replaces it atomically: the link itself, never what it
// points to.
func TestSpillGetOutputFile(t *testing.T) {
	srv, _, _, lines := spillChain(t)
	url := srv.Server.ClientURL()
	dir := t.TempDir()
	get := func(out string, extra ...string) (int, string) {
		code, stdout, errs := runCLI(t, "", append([]string{"spill", "get", "s/2.jsonl", "--nats-url", url, "-o", out}, extra...)...)
		assert.Empty(t, stdout)
		return code, errs
	}
	read := func(name string) string {
		b, err := os.ReadFile(name)
		require.NoError(t, err)
		return string(b)
	}
	isChain := func(name string) {
		got := strings.Split(strings.TrimSuffix(read(name), "\n"), "\n")
		assert.Equal(t, canonical(t, lines), canonical(t, got))
	}

	fresh := filepath.Join(dir, "fresh.jsonl")
	code, errs := get(fresh)
	require.Equal(t, 0, code, errs)
	isChain(fresh)

	existing := filepath.Join(dir, "existing.jsonl")
	require.NoError(t, os.WriteFile(existing, []byte("keep me\n"), 0o644))
	target := filepath.Join(dir, "target")
	require.NoError(t, os.WriteFile(target, []byte("the link's target\n"), 0o644))
	link := filepath.Join(dir, "link.jsonl")
	require.NoError(t, os.Symlink(target, link))
	dangling := filepath.Join(dir, "dangling.jsonl")
	nowhere := filepath.Join(dir, "nowhere")
	require.NoError(t, os.Symlink(nowhere, dangling))

	// The same command again: the file holds exactly this transcript, and
	// is left as it is.
	before, err := os.Stat(fresh)
	require.NoError(t, err)
	code, errs = get(fresh)
	require.Equal(t, 0, code, errs)
	assert.Contains(t, errs, "verified s/2.jsonl and its chain")
	assert.Contains(t, errs, fresh+" holds exactly this transcript already: left as it is")
	after, err := os.Stat(fresh)
	require.NoError(t, err)
	assert.True(t, os.SameFile(before, after), "the file itself is kept")
	isChain(fresh)

	// A file that holds anything else is refused once the transcript is
	// read; a symbolic link or a directory at once.
	for _, tc := range []struct{ name, want string }{
		{existing, "-o " + existing + ": the file exists and holds something other than this transcript; give --force to replace it"},
		{link, "-o " + link + ": the symbolic link exists; give --force to replace it"},
		{dangling, "-o " + dangling + ": the symbolic link exists; give --force to replace it"},
		{dir, "-o " + dir + " is a directory"},
	} {
		code, errs := get(tc.name)
		assert.Equal(t, 2, code, errs)
		assert.Contains(t, errs, tc.want)
		assert.NotContains(t, errs, "verified")
	}
	code, errs = get(dir, "--force")
	assert.Equal(t, 2, code, errs)
	assert.Contains(t, errs, "is a directory")
	assert.Equal(t, "keep me\n", read(existing))
	assert.Equal(t, "the link's target\n", read(target))
	_, err = os.Lstat(nowhere)
	assert.True(t, errors.Is(err, os.ErrNotExist), "a dangling link is not followed")

	for _, name := range []string{existing, link, dangling} {
		code, errs := get(name, "--force")
		require.Equal(t, 0, code, errs)
		st, err := os.Lstat(name)
		require.NoError(t, err)
		assert.True(t, st.Mode().IsRegular(), "%s is replaced by a file", name)
		isChain(name)
	}
	assert.Equal(t, "the link's target\n", read(target), "--force replaces the link, not its target")
	_, err = os.Lstat(nowhere)
	assert.True(t, errors.Is(err, os.ErrNotExist))

	left, err := filepath.Glob(filepath.Join(dir, ".spill-*"))
	require.NoError(t, err)
	assert.Empty(t, left, "no temporary file is left behind")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	assert.Equal(t, []string{"dangling.jsonl", "existing.jsonl", "fresh.jsonl", "link.jsonl", "target"}, names)
}

// TestPlaceOutput: a file at -o's name (made while the spill was being
// read, say) is not replaced without --force; one that holds exactly the
// transcript is left as it is.
func TestPlaceOutput(t *testing.T) {
	dir := t.TempDir()
	tmp, name := filepath.Join(dir, ".spill-1"), filepath.Join(dir, "out.jsonl")
	require.NoError(t, os.WriteFile(tmp, []byte("transcript\n"), 0o600))
	for _, other := range []string{"made meanwhile\n", "transcript\nand more\n", "transcrip\n", ""} {
		require.NoError(t, os.WriteFile(name, []byte(other), 0o644))
		kept, err := placeOutput(tmp, name, false)
		require.ErrorIs(t, err, errUsage, "%q", other)
		assert.False(t, kept)
		assert.Contains(t, err.Error(), "-o "+name+": the file exists and holds something other than this transcript; give --force to replace it")
		b, _ := os.ReadFile(name)
		assert.Equal(t, other, string(b))
	}

	require.NoError(t, os.WriteFile(name, []byte("transcript\n"), 0o644))
	kept, err := placeOutput(tmp, name, false)
	require.NoError(t, err)
	assert.True(t, kept)

	require.NoError(t, os.WriteFile(name, []byte("made meanwhile\n"), 0o644))
	kept, err = placeOutput(tmp, name, true)
	require.NoError(t, err)
	assert.False(t, kept)
	b, _ := os.ReadFile(name)
	assert.Equal(t, "transcript\n", string(b))
}

// TestSameBytes compares files across the reads' buffer boundary.
func TestSameBytes(t *testing.T) {
	dir := t.TempDir()
	big := []byte(strings.Repeat("0123456789abcdef", 10_000)) // several 32 KiB reads
	write := func(name string, b []byte) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, b, 0o600))
		return path
	}
	a := write("a", big)
	changed := append([]byte(nil), big...)
	changed[len(changed)-1] = 'X'
	for _, tc := range []struct {
		b    []byte
		same bool
	}{
		{big, true},
		{changed, false},
		{big[:len(big)-1], false},
		{append(append([]byte(nil), big...), '\n'), false},
		{nil, false},
	} {
		same, err := sameBytes(a, write("b", tc.b))
		require.NoError(t, err)
		assert.Equal(t, tc.same, same, "%d bytes", len(tc.b))
	}
	empty := write("empty", nil)
	same, err := sameBytes(empty, write("b", nil))
	require.NoError(t, err)
	assert.True(t, same)
}

// TestDiagnosticsIsTerminal: a command's standard error is a terminal when
// the one run was given is (replay's progress bar asks). isTerminal takes
// any character device for one, such as /dev/null.
func TestDiagnosticsIsTerminal(t *testing.T) {
	tty, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer tty.Close()
	require.True(t, isTerminal(tty))
	assert.True(t, isTerminal(&diagnostics{stdout: os.Stdout, stderr: tty}))
	assert.False(t, isTerminal(&diagnostics{stdout: tty, stderr: &strings.Builder{}}))
}

// TestNoAtomicBatchesFlag: serve's --no-atomic-batches (and its variable)
// reaches the processor's configuration; the default batches.
func TestNoAtomicBatchesFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{{nil, false}, {[]string{"--no-atomic-batches"}, true}, {[]string{"--no-atomic-batches=false"}, false}} {
		var p procFlags
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		p.register(fs)
		require.NoError(t, fs.Parse(tc.args))
		cfg, err := p.config()
		require.NoError(t, err)
		require.Equal(t, tc.want, cfg.NoAtomicBatches, "%v", tc.args)
	}
}
