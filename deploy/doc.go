// Package deploy holds what runs seamguard outside a test: the nats-server
// configuration of a three-node JetStream cluster and of a single server
// (nats/), with one account and three least-privilege identities (agent,
// processor, operator); the Kubernetes manifests of the processor
// (kubernetes/); values for the official NATS Helm chart (helm/); an example
// Grafana dashboard over the processors' /metrics (grafana/); and, at the
// repository root, docker-compose.yaml and the Dockerfile. healthcheck/ is the
// small probe the image uses for container health checks, since the image has
// no shell.
//
// The package has no code of its own. Its tests are the reason it exists:
// they parse every file here, check that the compose file, the manifests and
// the Helm values agree with the server configuration and with the flags of
// seamguard serve, and load the shipped configuration into real in-process
// nats-servers to prove what each identity may and may not do, with the
// subjects nats.go's jetstream package actually uses. Docker and Kubernetes
// themselves are not run by the tests. deploy/README.md is the operations
// guide.
package deploy
