package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
)

func runVersion(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: seamguard version (or seamguard --version)")
		fmt.Fprintln(stderr, "\nPrints the module version, the VCS revision the binary was built from (its time,")
		fmt.Fprintln(stderr, "and whether the working tree had changes), and the Go version that built it.")
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("%w: version takes no arguments, got %q", errUsage, pos)
	}
	info, ok := debug.ReadBuildInfo()
	_, err = io.WriteString(stdout, versionText(info, ok))
	return err
}

// versionText describes a build: the main module's path and version (go
// install path@version sets it; a build in a checkout says "(devel)"), the
// VCS revision, its time and whether the tree was modified (go build in a
// git checkout records them), and the Go version and platform.
func versionText(info *debug.BuildInfo, ok bool) string {
	var b strings.Builder
	if !ok || info == nil {
		fmt.Fprintf(&b, "seamguard: no build information in this binary\n")
		fmt.Fprintf(&b, "go: %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return b.String()
	}
	version := info.Main.Version
	if version == "" {
		version = "(unknown)"
	}
	path := info.Main.Path
	if path == "" {
		path = "github.com/seamguard/seamguard"
	}
	fmt.Fprintf(&b, "seamguard %s\n", version)
	fmt.Fprintf(&b, "module: %s\n", path)
	s := map[string]string{}
	for _, kv := range info.Settings {
		s[kv.Key] = kv.Value
	}
	switch rev := s["vcs.revision"]; {
	case rev == "":
		fmt.Fprintf(&b, "revision: unknown (built without VCS information: not with go build in a git checkout, or with -buildvcs=false)\n")
	default:
		if s["vcs.modified"] == "true" {
			rev += " (modified: the working tree had uncommitted changes)"
		}
		fmt.Fprintf(&b, "revision: %s\n", rev)
		if t := s["vcs.time"]; t != "" {
			fmt.Fprintf(&b, "committed: %s\n", t)
		}
	}
	goVersion := info.GoVersion
	if goVersion == "" {
		goVersion = runtime.Version()
	}
	fmt.Fprintf(&b, "go: %s %s/%s\n", goVersion, runtime.GOOS, runtime.GOARCH)
	return b.String()
}
