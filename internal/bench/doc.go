// Package bench measures seamguard against raw JetStream on the same
// server, in the same run, and reports ratios: absolute numbers drift on a
// shared machine, ratios measured side by side much less.
//
// Run measures five things (see Report): ingest throughput of the processor
// against a plain durable pull consumer on the same events (a read rate) and
// a pipelined durable publish of them (a write rate), with atomic batches
// and with per-message writes; decision latency against a raw publish,
// consume and reply round trip; events per second at 100,000 to a million
// live sessions, each event of a different session, against three raw
// anchors at the same key count (pipelined KV puts of existing keys,
// pipelined compare-and-set updates, a pull consumer reading the same
// events), with per-message writes, lazily synced at the largest size, and
// memory per session held, and at the largest size the time from a crash
// of server and processor (SIGKILL) to the first decision; the cost of one
// decision against the number of truncated ranges, and against a
// straightforward port of the classic check (internal/seedref); and a
// spill against a raw object store put of the same bytes.
//
// Inputs are generated from fixed seeds, so every run measures the same
// events. The server is, in order of preference, the one at Config.URL, a
// child process (Config.Child), so that the process's resident memory is the
// processor's and the client's only, or an embedded server in this process.
// The Report says which.
//
// For profiling, `seamguard bench --cpuprofile FILE` profiles this process
// (the processor and the clients), `--sessions-cpuprofile FILE` only while
// seamguard decides the events of the largest number of sessions (with
// `--in-process`, the server too), `--ingest-cpuprofile FILE` only while
// seamguard decides the last round of the 1 KiB ingest measurement,
// `--memprofile FILE` writes a heap
// profile while those sessions are held, and SEAMGUARD_BENCH_SERVER_CPUPROFILE=FILE
// makes each child server profile itself (each overwrites the last: skip
// all measurements but one). SEAMGUARD_BENCH_LOG=info shows the processors' logs.
//
// Run is not safe for concurrent use: it reads the process's own memory.
package bench
