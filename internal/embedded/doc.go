// Package embedded starts a nats-server with JetStream inside the process:
// the default server of `seamguard serve` and `demo`, and the real server
// every integration test runs against. Nothing needs to be installed.
package embedded
