package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			w.Write([]byte("ok"))
		case "/readyz":
			http.Error(w, "consumers not running", http.StatusServiceUnavailable)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()

	for _, tc := range []struct {
		name string
		args []string
		want int
		says string
	}{
		{"healthy", []string{srv.URL + "/healthz"}, 0, ""},
		{"one not ready", []string{srv.URL + "/healthz", srv.URL + "/readyz"}, 1, "503 Service Unavailable: consumers not running"},
		{"not found", []string{srv.URL + "/nope"}, 1, "404"},
		{"nothing listening", []string{"-timeout", "1s", closed.URL + "/healthz"}, 1, "healthcheck: " + closed.URL},
		{"no URL", nil, 2, "usage"},
		{"bad flag", []string{"-nope"}, 2, "flag provided but not defined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if got := run(tc.args, &stderr); got != tc.want {
				t.Errorf("exit status %d, want %d; stderr: %s", got, tc.want, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.says) {
				t.Errorf("stderr %q does not say %q", stderr.String(), tc.says)
			}
		})
	}
}
