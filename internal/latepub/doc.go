// Package latepub sends JetStream publishes later than they are asked for,
// for tests of what a late publish does to order: the NATS client sends a
// publish again a moment after the server answers "no responders" (a
// stream leader moving), after the publishes sent behind it.
package latepub
