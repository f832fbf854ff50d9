// Command healthcheck is the container health check of the seamguard image,
// which has no shell, curl or wget: it GETs every URL given as an argument and
// exits 0 when each answers 2xx within the timeout, 1 otherwise, printing one
// line per failure. docker-compose.yaml runs
//
//	/healthcheck http://127.0.0.1:8080/healthz http://127.0.0.1:8080/readyz
//
// Kubernetes does not need it: its probes are HTTP requests of the kubelet.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// run checks the URLs of args and returns the exit status.
func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", 3*time.Second, "how long each URL may take")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "usage: healthcheck [-timeout 3s] URL...")
		return 2
	}
	client := &http.Client{Timeout: *timeout}
	status := 0
	for _, url := range fs.Args() {
		if err := check(client, url); err != nil {
			fmt.Fprintf(stderr, "healthcheck: %s: %v\n", url, err)
			status = 1
		}
	}
	return status
}

func check(client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("%s: %s", resp.Status, body)
	}
	return nil
}
