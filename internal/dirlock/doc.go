// Package dirlock gives one process at a time a directory: `seamguard
// serve` takes its --data-dir with Acquire before it uses anything in it
// (the embedded server's JetStream store, the signing key), so that a second
// serve on the same directory refuses at once instead of writing beside the
// first.
//
// The lock is a file, LOCK, in the directory. Where the system has flock(2)
// (Linux, the BSDs, macOS) the process holds an exclusive advisory lock on
// it for as long as it runs: the kernel drops the lock when the process
// exits, however it exits, so a holder killed with SIGKILL does not leave
// the directory locked. Elsewhere the file is created exclusively and
// removed on Release; a holder that dies leaves it behind, and the error
// says to remove it once that process is gone.
//
// Once it holds the lock, the holder writes into the file who it is: its
// PID, host, the addresses it listens on and when it started. A process
// refused the lock reads that back and names the holder in its error
// (*LockedError).
package dirlock
