// Package longtest tells the long test suites from the fast default one.
//
// `go test ./...` runs the fast suite: every package, against real
// embedded NATS servers, in a few minutes. The long suites (the fault
// suite's power cuts, partitions and hand-overs, the hostile inputs, chaos,
// bursts, clusters, the binary killed and restarted) run when the
// environment sets SEAMGUARD_LONG=1, as .ci/run does:
//
//	SEAMGUARD_LONG=1 go test -p 1 -timeout 25m ./...
package longtest
