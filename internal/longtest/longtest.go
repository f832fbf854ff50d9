package longtest

import (
	"os"
	"testing"
)

// Env is the environment variable that turns the long suites on.
const Env = "SEAMGUARD_LONG"

// Enabled reports whether the long suites run: Env is "1" or "true".
func Enabled() bool {
	v := os.Getenv(Env)
	return v == "1" || v == "true"
}

// Skip skips t unless the long suites run, saying how to run it.
func Skip(t testing.TB) {
	t.Helper()
	if !Enabled() {
		t.Skipf("a long suite: run it with %s=1 (.ci/run does)", Env)
	}
}
