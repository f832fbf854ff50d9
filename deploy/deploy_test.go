package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"go.yaml.in/yaml/v3"
)

// These tests check that the deployment files agree with one another, with
// the nats-server configuration and with the flags of seamguard serve. They
// read files only; security_test.go runs servers.

// root is the repository root; tests run in deploy/.
const root = ".."

// Passwords the tests give the servers; compose's defaults are used where a
// test loads a config the way docker-compose.yaml does.
const (
	agentPassword     = "agent-test-pw"
	processorPassword = "processor-test-pw"
	responderPassword = "responder-test-pw"
	operatorPassword  = "operator-test-pw"
	forwarderPassword = "forwarder-test-pw"
)

// setPasswords sets the environment the nats configs read passwords from.
func setPasswords(t *testing.T) {
	t.Setenv("NATS_AGENT_PASSWORD", agentPassword)
	t.Setenv("NATS_PROCESSOR_PASSWORD", processorPassword)
	t.Setenv("NATS_RESPONDER_PASSWORD", responderPassword)
	t.Setenv("NATS_OPERATOR_PASSWORD", operatorPassword)
	t.Setenv("NATS_FORWARDER_PASSWORD", forwarderPassword)
}

// flagCall finds flag registrations: fs.StringVar(&x, "name", ...),
// fs.Var(v, "name", ...), fs.String("name", ...) and the like.
var flagCall = regexp.MustCompile(`\.(?:[A-Z][A-Za-z0-9]*Var|String|Int|Int64|Uint|Uint64|Bool|Duration|Float64|Func|BoolFunc|Var)\(([^"\n]*?)"([a-z][a-z0-9-]*)"`)

// serveFlags returns the flag names registered in cmd/seamguard's source.
func serveFlags(t *testing.T) map[string]bool {
	t.Helper()
	dir := filepath.Join(root, "cmd", "seamguard")
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	flags := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range flagCall.FindAllStringSubmatch(string(src), -1) {
			flags[m[2]] = true
		}
	}
	for _, must := range []string{"nats-url", "user", "password", "replicas"} {
		if !flags[must] {
			t.Fatalf("found no --%s flag in %s: the flag scanner is broken (found %v)", must, dir, flags)
		}
	}
	return flags
}

// envName is cmd/seamguard's rule: SEAMGUARD_ and the flag name in upper
// case with '_' for '-'.
func envName(flag string) string {
	return "SEAMGUARD_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// envOnly are the variables serve reads that no flag names (a secret that
// must not appear on a command line), and the file of cmd/seamguard that
// reads each.
var envOnly = map[string]string{"SEAMGUARD_SIGNING_KEY": "signing.go"}

// checkSeamguardEnv reports every SEAMGUARD_ variable of env that no flag of
// seamguard serve reads.
func checkSeamguardEnv(t *testing.T, where string, env []string) {
	t.Helper()
	flags := serveFlags(t)
	byEnv := map[string]bool{}
	for f := range flags {
		byEnv[envName(f)] = true
	}
	for name, file := range envOnly {
		src, err := os.ReadFile(filepath.Join(root, "cmd", "seamguard", file))
		if err != nil || !strings.Contains(string(src), `"`+name+`"`) {
			t.Fatalf("cmd/seamguard/%s does not read %s any more: update envOnly (%v)", file, name, err)
		}
		byEnv[name] = true
	}
	for _, name := range env {
		if strings.HasPrefix(name, "SEAMGUARD_") && !byEnv[name] {
			t.Errorf("%s sets %s, but seamguard serve has no flag that reads it", where, name)
		}
	}
}

// yamlDocs parses every document of a YAML file.
func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	var docs []map[string]any
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if doc != nil {
			docs = append(docs, doc)
		}
	}
	if len(docs) == 0 {
		t.Fatalf("%s holds no YAML document", path)
	}
	return docs
}

func decodeYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func TestEveryYAMLFileParses(t *testing.T) {
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(root, path)
		if !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) &&
			(strings.HasPrefix(rel, "deploy"+string(filepath.Separator)) || !strings.Contains(rel, string(filepath.Separator))) {
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"docker-compose.yaml",
		filepath.Join("deploy", "helm", "nats-values.yaml"),
		filepath.Join("deploy", "kubernetes", "configmap.yaml"),
		filepath.Join("deploy", "kubernetes", "deployment.yaml"),
		filepath.Join("deploy", "kubernetes", "secret.example.yaml"),
	} {
		if !slices.Contains(files, want) {
			t.Errorf("%s is missing (found %v)", want, files)
		}
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) { yamlDocs(t, filepath.Join(root, f)) })
	}
}

// natsConfig loads a config of deploy/nats with env set for the call.
func natsConfig(t *testing.T, name string, env map[string]string) *server.Options {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	opts, err := server.ProcessConfigFile(filepath.Join("nats", name))
	if err != nil {
		t.Fatalf("deploy/nats/%s: %v", name, err)
	}
	return opts
}

func clusterEnv(name string, routes ...string) map[string]string {
	return map[string]string{
		"SERVER_NAME":             name,
		"NATS_ROUTES":             "[" + strings.Join(routes, ", ") + "]",
		"NATS_AGENT_PASSWORD":     agentPassword,
		"NATS_PROCESSOR_PASSWORD": processorPassword,
		"NATS_RESPONDER_PASSWORD": responderPassword,
		"NATS_OPERATOR_PASSWORD":  operatorPassword,
		"NATS_FORWARDER_PASSWORD": forwarderPassword,
	}
}

// users returns the configured users by name.
func users(opts *server.Options) map[string]*server.User {
	m := map[string]*server.User{}
	for _, u := range opts.Users {
		m[u.Username] = u
	}
	return m
}

func TestNATSConfigs(t *testing.T) {
	t.Run("cluster", func(t *testing.T) {
		opts := natsConfig(t, "nats-server.conf", clusterEnv("nats-1", "nats-route://nats-2:6222", "nats-route://nats-3:6222"))
		if opts.ServerName != "nats-1" {
			t.Errorf("server_name is %q; it should come from $SERVER_NAME", opts.ServerName)
		}
		if opts.Cluster.Name != "seamguard" || opts.Cluster.Port != 6222 {
			t.Errorf("cluster is %q on port %d, want seamguard on 6222", opts.Cluster.Name, opts.Cluster.Port)
		}
		var routes []string
		for _, r := range opts.Routes {
			routes = append(routes, r.String())
		}
		if want := []string{"nats-route://nats-2:6222", "nats-route://nats-3:6222"}; !slices.Equal(routes, want) {
			t.Errorf("routes are %v; they should come from $NATS_ROUTES, %v", routes, want)
		}
		if !opts.JetStream || opts.StoreDir != "/data" {
			t.Errorf("jetstream %v with store_dir %q, want enabled on /data", opts.JetStream, opts.StoreDir)
		}
		if !opts.SyncAlways {
			t.Errorf("jetstream syncs every %s; want sync_interval: always, or a power cut loses acknowledged data", opts.SyncInterval)
		}
		if opts.Port != 4222 || opts.HTTPPort != 8222 {
			t.Errorf("client port %d, monitoring port %d; want 4222 and 8222", opts.Port, opts.HTTPPort)
		}
		checkAccounts(t, opts)
	})
	t.Run("standalone", func(t *testing.T) {
		setPasswords(t)
		opts := natsConfig(t, "standalone.conf", nil)
		if opts.Host != "127.0.0.1" || opts.HTTPHost != "127.0.0.1" {
			t.Errorf("standalone listens on %q, monitoring on %q; want loopback only", opts.Host, opts.HTTPHost)
		}
		if !opts.SyncAlways {
			t.Errorf("standalone jetstream syncs every %s; want sync_interval: always", opts.SyncInterval)
		}
		if !opts.JetStream || opts.Cluster.Port != 0 || len(opts.Routes) != 0 {
			t.Errorf("standalone: jetstream %v, cluster port %d, routes %v; want JetStream and no cluster", opts.JetStream, opts.Cluster.Port, opts.Routes)
		}
		checkAccounts(t, opts)
		cluster := natsConfig(t, "nats-server.conf", clusterEnv("nats-1", "nats-route://nats-2:6222"))
		cu := users(cluster)
		for name, u := range users(opts) {
			if !reflect.DeepEqual(u.Permissions, cu[name].Permissions) {
				t.Errorf("user %s has other permissions in standalone.conf than in nats-server.conf", name)
			}
		}
	})
	t.Run("missing password", func(t *testing.T) {
		t.Setenv("SERVER_NAME", "nats-1")
		t.Setenv("NATS_ROUTES", "[nats-route://nats-2:6222]")
		t.Setenv("NATS_PROCESSOR_PASSWORD", processorPassword)
		t.Setenv("NATS_RESPONDER_PASSWORD", responderPassword)
		t.Setenv("NATS_OPERATOR_PASSWORD", operatorPassword)
		t.Setenv("NATS_FORWARDER_PASSWORD", forwarderPassword)
		t.Setenv("NATS_AGENT_PASSWORD", "") // restored after the test
		os.Unsetenv("NATS_AGENT_PASSWORD")
		if _, err := server.ProcessConfigFile(filepath.Join("nats", "nats-server.conf")); err == nil || !strings.Contains(err.Error(), "NATS_AGENT_PASSWORD") {
			t.Errorf("a missing NATS_AGENT_PASSWORD must stop the server; got %v", err)
		}
	})
}

// checkAccounts checks the identities of accounts.conf as the server sees them.
func checkAccounts(t *testing.T, opts *server.Options) {
	t.Helper()
	us := users(opts)
	want := map[string]string{"agent": agentPassword, "processor": processorPassword, "responder": responderPassword, "operator": operatorPassword, "forwarder": forwarderPassword}
	if len(us) != len(want) {
		t.Errorf("users %v, want exactly agent, processor, responder, operator and forwarder", slices.Sorted(maps.Keys(us)))
	}
	for name, pw := range want {
		u := us[name]
		if u == nil {
			t.Errorf("no user %s", name)
			continue
		}
		if u.Account == nil || u.Account.Name != "SEAMGUARD" {
			t.Errorf("user %s is not in account SEAMGUARD", name)
		}
		if u.Password != pw {
			t.Errorf("user %s's password does not come from $NATS_%s_PASSWORD", name, strings.ToUpper(name))
		}
		if u.Permissions == nil || u.Permissions.Publish == nil || u.Permissions.Subscribe == nil {
			t.Errorf("user %s has no publish and subscribe permissions: it could do anything", name)
		}
		if u.Permissions != nil && u.Permissions.Response != nil {
			t.Errorf("user %s has allow_responses: any request it receives lets the requester name a subject it may then publish to, whatever its deny list says", name)
		}
	}
	if !slices.ContainsFunc(opts.Accounts, func(a *server.Account) bool { return a.Name == "SEAMGUARD" }) {
		t.Errorf("account SEAMGUARD is not configured")
	}
}

// composeFile is what the tests read of docker-compose.yaml.
type composeFile struct {
	Name     string                    `yaml:"name"`
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       *composeBuild     `yaml:"build"`
	Command     []string          `yaml:"command"`
	Hostname    string            `yaml:"hostname"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	User        string            `yaml:"user"`
	ReadOnly    bool              `yaml:"read_only"`
	Healthcheck struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	DependsOn map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
}

type composeBuild struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	var c composeFile
	decodeYAML(t, filepath.Join(root, "docker-compose.yaml"), &c)
	return c
}

// interpolation is compose's ${VAR}, ${VAR:-default} and ${VAR-default}.
var interpolation = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}`)

// interpolate resolves s as docker compose would with none of the variables
// set: every ${VAR:-default} becomes its default.
func interpolate(t *testing.T, s string) string {
	t.Helper()
	s = strings.ReplaceAll(s, "$$", "\x00")
	s = interpolation.ReplaceAllStringFunc(s, func(m string) string {
		sub := interpolation.FindStringSubmatch(m)
		if sub[2] == "" {
			t.Errorf("%q has no default: docker compose up would need %s set", m, sub[1])
		}
		return sub[3]
	})
	if strings.Contains(s, "$") {
		t.Errorf("%q: a $ compose would not interpolate as meant", s)
	}
	return strings.ReplaceAll(s, "\x00", "$")
}

// resolvedEnv is a service's environment as its container sees it.
func resolvedEnv(t *testing.T, svc composeService) map[string]string {
	env := map[string]string{}
	for k, v := range svc.Environment {
		env[k] = interpolate(t, v)
	}
	return env
}

// composeServices splits the services into NATS servers and seamguards.
func composeServices(t *testing.T, c composeFile) (nats, seamguards []string) {
	t.Helper()
	for name, svc := range c.Services {
		switch {
		case strings.HasPrefix(svc.Image, "nats:"):
			nats = append(nats, name)
		case svc.Build != nil:
			seamguards = append(seamguards, name)
		default:
			t.Errorf("service %s is neither a nats server (image nats:...) nor built from the Dockerfile", name)
		}
	}
	slices.Sort(nats)
	slices.Sort(seamguards)
	return nats, seamguards
}

var natsTag = regexp.MustCompile(`^nats:(\d+)\.(\d+)\.(\d+)(-alpine)?$`)

// serverLibraryMinor is the major.minor of nats-server in go.mod.
func serverLibraryMinor(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`github\.com/nats-io/nats-server/v2 v(\d+\.\d+)\.\d+`).FindSubmatch(b)
	if m == nil {
		t.Fatal("go.mod does not require github.com/nats-io/nats-server/v2")
	}
	return string(m[1])
}

func TestCompose(t *testing.T) {
	c := loadCompose(t)
	nats, seamguards := composeServices(t, c)
	if len(nats) != 3 || len(seamguards) != 2 {
		t.Fatalf("compose has nats services %v and seamguard services %v; want 3 and 2", nats, seamguards)
	}
	libMinor := serverLibraryMinor(t)

	var clientPort, httpPort int
	var processorPW, responderPW string
	names := map[string]bool{}
	for _, name := range nats {
		svc := c.Services[name]
		t.Run(name, func(t *testing.T) {
			m := natsTag.FindStringSubmatch(svc.Image)
			if m == nil {
				t.Fatalf("image %q is not a pinned nats:X.Y.Z[-alpine] tag", svc.Image)
			}
			if minor := m[1] + "." + m[2]; minor != libMinor {
				t.Errorf("image %s is nats-server %s, but the tests run the server library %s (go.mod): keep them on one minor release", svc.Image, minor, libMinor)
			}
			if svc.Image != c.Services[nats[0]].Image {
				t.Errorf("image %s differs from %s's %s", svc.Image, nats[0], c.Services[nats[0]].Image)
			}
			if m[4] == "" {
				t.Errorf("image %s has no shell or wget for the health check; use the -alpine variant", svc.Image)
			}
			if svc.Hostname != name {
				t.Errorf("hostname %q, want the service name %q (routes and SEAMGUARD_NATS_URL use it)", svc.Hostname, name)
			}

			// The config it runs must be a file of this repository, mounted.
			i := slices.Index(svc.Command, "--config")
			if i < 0 || i+1 >= len(svc.Command) {
				t.Fatalf("command %v gives no --config FILE", svc.Command)
			}
			confPath := svc.Command[i+1]
			var hostConf string
			namedStore := ""
			for _, v := range svc.Volumes {
				parts := strings.Split(v, ":")
				if len(parts) < 2 {
					t.Errorf("volume %q is not SOURCE:TARGET", v)
					continue
				}
				src, dst := parts[0], parts[1]
				if strings.HasPrefix(src, ".") {
					if _, err := os.Stat(filepath.Join(root, src)); err != nil {
						t.Errorf("volume %q mounts %s, which is not in the repository", v, src)
					}
					if rel, ok := strings.CutPrefix(confPath, dst+"/"); ok {
						hostConf = filepath.Join(root, src, rel)
					}
					if len(parts) < 3 || parts[2] != "ro" {
						t.Errorf("volume %q: mount configuration read-only (:ro)", v)
					}
					continue
				}
				if _, ok := c.Volumes[src]; !ok {
					t.Errorf("volume %q uses %s, which the top-level volumes do not declare", v, src)
				}
				namedStore = dst
			}
			if hostConf == "" {
				t.Fatalf("--config %s is not inside a volume mounted from the repository", confPath)
			}
			if _, err := os.Stat(hostConf); err != nil {
				t.Fatalf("--config %s is %s in the repository: %v", confPath, hostConf, err)
			}

			env := resolvedEnv(t, svc)
			for k, v := range env {
				t.Setenv(k, v)
			}
			opts, err := server.ProcessConfigFile(hostConf)
			if err != nil {
				t.Fatalf("%s with %s's environment: %v", hostConf, name, err)
			}
			if names[opts.ServerName] {
				t.Errorf("server_name %q is used twice", opts.ServerName)
			}
			names[opts.ServerName] = true
			if opts.ServerName != name {
				t.Errorf("server_name %q, want %q", opts.ServerName, name)
			}
			if namedStore == "" || namedStore != opts.StoreDir {
				t.Errorf("JetStream stores in %q, but the named volume is mounted at %q", opts.StoreDir, namedStore)
			}
			var hosts []string
			for _, r := range opts.Routes {
				if r.Port() != strconv.Itoa(opts.Cluster.Port) {
					t.Errorf("route %s: port %s, but the cluster listens on %d", r, r.Port(), opts.Cluster.Port)
				}
				hosts = append(hosts, r.Hostname())
			}
			slices.Sort(hosts)
			others := slices.DeleteFunc(slices.Clone(nats), func(s string) bool { return s == name })
			if !slices.Equal(hosts, others) {
				t.Errorf("routes name %v, want the other nats services %v", hosts, others)
			}
			wantHealth := fmt.Sprintf("http://127.0.0.1:%d/healthz?js-enabled-only=true", opts.HTTPPort)
			if !slices.Contains(svc.Healthcheck.Test, wantHealth) {
				t.Errorf("health check %v does not GET %s (the monitoring port of the config)", svc.Healthcheck.Test, wantHealth)
			}
			clientPort, httpPort = opts.Port, opts.HTTPPort
			if processorPW == "" {
				processorPW = env["NATS_PROCESSOR_PASSWORD"]
				responderPW = env["NATS_RESPONDER_PASSWORD"]
			}
			for _, u := range []string{"agent", "processor", "responder", "operator", "forwarder"} {
				if users(opts)[u] == nil {
					t.Errorf("no user %s", u)
				}
			}
		})
	}
	if httpPort == 0 {
		t.Fatal("no nats service could be checked")
	}

	for _, name := range seamguards {
		svc := c.Services[name]
		t.Run(name, func(t *testing.T) {
			checkDockerBuild(t, svc.Build)
			env := resolvedEnv(t, svc)
			checkSeamguardEnv(t, "docker-compose.yaml "+name, slices.Collect(maps.Keys(env)))
			var hosts []string
			for _, u := range strings.Split(env["SEAMGUARD_NATS_URL"], ",") {
				pu, err := url.Parse(u)
				if err != nil || pu.Scheme != "nats" {
					t.Errorf("SEAMGUARD_NATS_URL entry %q is not a nats:// URL", u)
					continue
				}
				if pu.Port() != strconv.Itoa(clientPort) {
					t.Errorf("SEAMGUARD_NATS_URL entry %q: the servers listen on %d", u, clientPort)
				}
				hosts = append(hosts, pu.Hostname())
			}
			slices.Sort(hosts)
			if !slices.Equal(hosts, nats) {
				t.Errorf("SEAMGUARD_NATS_URL names %v, want every nats service %v", hosts, nats)
			}
			// serve checks at start that the servers sync before they
			// acknowledge, on their monitoring endpoints.
			hosts = nil
			for _, u := range strings.Split(env["SEAMGUARD_NATS_MONITOR_URL"], ",") {
				pu, err := url.Parse(u)
				if err != nil || pu.Scheme != "http" || pu.Port() != strconv.Itoa(httpPort) {
					t.Errorf("SEAMGUARD_NATS_MONITOR_URL entry %q is not http://HOST:%d, the monitoring port", u, httpPort)
					continue
				}
				hosts = append(hosts, pu.Hostname())
			}
			slices.Sort(hosts)
			if !slices.Equal(hosts, nats) {
				t.Errorf("SEAMGUARD_NATS_MONITOR_URL names %v, want every nats service %v", hosts, nats)
			}
			if env["SEAMGUARD_USER"] != "processor" || env["SEAMGUARD_PASSWORD"] != processorPW {
				t.Errorf("seamguard connects as %q with %q; want processor with the servers' NATS_PROCESSOR_PASSWORD", env["SEAMGUARD_USER"], env["SEAMGUARD_PASSWORD"])
			}
			if env["SEAMGUARD_RESPONDER_USER"] != "responder" || env["SEAMGUARD_RESPONDER_PASSWORD"] != responderPW {
				t.Errorf("seamguard's recover service answers as %q with %q; want responder with the servers' NATS_RESPONDER_PASSWORD", env["SEAMGUARD_RESPONDER_USER"], env["SEAMGUARD_RESPONDER_PASSWORD"])
			}
			if r, _ := strconv.Atoi(env["SEAMGUARD_REPLICAS"]); r != 3 || r > len(nats) {
				t.Errorf("SEAMGUARD_REPLICAS %q; want 3 on the 3 servers", env["SEAMGUARD_REPLICAS"])
			}
			_, port, err := net.SplitHostPort(env["SEAMGUARD_HEALTH_LISTEN"])
			if err != nil {
				t.Fatalf("SEAMGUARD_HEALTH_LISTEN %q: %v", env["SEAMGUARD_HEALTH_LISTEN"], err)
			}
			test := svc.Healthcheck.Test
			if len(test) < 3 || test[0] != "CMD" || test[1] != "/healthcheck" {
				t.Errorf("health check %v should run the image's /healthcheck probe", test)
			}
			for _, path := range []string{"/healthz", "/readyz"} {
				if u := "http://127.0.0.1:" + port + path; !slices.Contains(test, u) {
					t.Errorf("health check %v does not GET %s", test, u)
				}
			}
			for _, n := range nats {
				if svc.DependsOn[n].Condition != "service_healthy" {
					t.Errorf("does not wait for %s to be healthy", n)
				}
			}
			if svc.User != "65532:65532" || !svc.ReadOnly {
				t.Errorf("user %q, read_only %v; want the image's nonroot user 65532 and a read-only root", svc.User, svc.ReadOnly)
			}
		})
	}
}

// dockerfile is the repository's Dockerfile with continuation lines joined.
type dockerfile struct {
	instructions [][2]string // instruction, arguments
}

func loadDockerfile(t *testing.T) dockerfile {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var d dockerfile
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(line)
		instr, args, _ := strings.Cut(cur.String(), " ")
		d.instructions = append(d.instructions, [2]string{strings.ToUpper(instr), strings.TrimSpace(args)})
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d dockerfile) all(instr string) []string {
	var out []string
	for _, in := range d.instructions {
		if in[0] == instr {
			out = append(out, in[1])
		}
	}
	return out
}

func checkDockerBuild(t *testing.T, b *composeBuild) {
	t.Helper()
	if b == nil || filepath.Clean(b.Context) != "." || (b.Dockerfile != "" && b.Dockerfile != "Dockerfile") {
		t.Errorf("build %+v; want the repository's Dockerfile with the repository as context", b)
	}
}

// buildTargets are the package paths go build compiles in the Dockerfile.
var buildTargets = regexp.MustCompile(`go build [^&;]*?(\./[A-Za-z0-9_/.-]+)`)

func TestDockerfile(t *testing.T) {
	d := loadDockerfile(t)
	froms := d.all("FROM")
	if len(froms) < 2 {
		t.Fatalf("FROM %v: want a multi-stage build", froms)
	}
	goMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(goMod)
	if goVersion == nil || !strings.Contains(froms[0], "golang:"+string(goVersion[1])) {
		t.Errorf("first stage %q does not build with golang:%s (go.mod)", froms[0], goVersion[1])
	}
	final := froms[len(froms)-1]
	if !strings.HasPrefix(final, "gcr.io/distroless/static") && !strings.HasPrefix(final, "scratch") {
		t.Errorf("final stage %q is not distroless/static or scratch", final)
	}
	runs := strings.Join(d.all("RUN"), "\n")
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags "-s -w"`} {
		if !strings.Contains(runs, want) {
			t.Errorf("the build does not use %s", want)
		}
	}
	var targets []string
	for _, m := range buildTargets.FindAllStringSubmatch(runs, -1) {
		targets = append(targets, m[1])
	}
	for _, want := range []string{"./cmd/seamguard", "./deploy/healthcheck"} {
		if !slices.Contains(targets, want) {
			t.Errorf("the Dockerfile does not build %s (builds %v)", want, targets)
		}
	}
	for _, target := range targets {
		if !isMainPackage(t, filepath.Join(root, target)) {
			t.Errorf("build target %s is not a main package of this repository", target)
		}
	}
	copies := strings.Join(d.all("COPY"), "\n")
	for _, want := range []string{" /seamguard", " /healthcheck"} {
		if !strings.Contains(copies, want) {
			t.Errorf("the final image has no %s", strings.TrimSpace(want))
		}
	}
	if e := d.all("ENTRYPOINT"); len(e) != 1 || e[0] != `["/seamguard"]` {
		t.Errorf("ENTRYPOINT %v, want [\"/seamguard\"]", e)
	}
	if c := d.all("CMD"); len(c) != 1 || c[0] != `["serve"]` {
		t.Errorf("CMD %v, want [\"serve\"]", c)
	}
	if u := d.all("USER"); len(u) == 0 || (!strings.HasPrefix(u[len(u)-1], "65532") && !strings.HasPrefix(u[len(u)-1], "nonroot")) {
		t.Errorf("USER %v: the image must run as the nonroot user", u)
	}

	// .dockerignore must keep what the build reads.
	ignore, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, l := range strings.Split(string(ignore), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			patterns = append(patterns, l)
		}
	}
	for _, keep := range []string{"go.mod", "go.sum", "cmd/seamguard/main.go", "deploy/healthcheck/main.go", "processor/runtime.go", "processor/ledger/doc.go", "spill/objectstore.go", "events/doc.go", "internal/embedded/embedded.go"} {
		for _, p := range patterns {
			if ignored(p, keep) {
				t.Errorf(".dockerignore pattern %q drops %s, which the build needs", p, keep)
			}
		}
	}
	if !slices.ContainsFunc(patterns, func(p string) bool { return ignored(p, ".git/HEAD") }) {
		t.Errorf(".dockerignore does not drop .git")
	}
}

// ignored reports whether a .dockerignore pattern excludes path (a subset of
// the syntax: globs, directories, and a leading **/).
func ignored(pattern, path string) bool {
	segs := strings.Split(path, "/")
	match := func(p string, segs []string) bool {
		for i := 1; i <= len(segs); i++ {
			if ok, _ := filepath.Match(p, strings.Join(segs[:i], "/")); ok {
				return true
			}
		}
		return false
	}
	if p, ok := strings.CutPrefix(pattern, "**/"); ok {
		for i := range segs {
			if match(p, segs[i:]) {
				return true
			}
		}
		return false
	}
	return match(pattern, segs)
}

func isMainPackage(t *testing.T, dir string) bool {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if regexp.MustCompile(`(?m)^package main$`).Match(b) {
			return true
		}
	}
	return false
}

// k8sObjects returns every object of deploy/kubernetes by kind and name.
func k8sObjects(t *testing.T) map[string]map[string]any {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("kubernetes", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/kubernetes: %v", err)
	}
	objs := map[string]map[string]any{}
	for _, f := range files {
		for _, doc := range yamlDocs(t, f) {
			kind, _ := doc["kind"].(string)
			name, _ := dig(doc, "metadata", "name").(string)
			if kind == "" || name == "" || doc["apiVersion"] == nil {
				t.Errorf("%s: an object without apiVersion, kind or metadata.name", f)
				continue
			}
			objs[kind+"/"+name] = doc
		}
	}
	return objs
}

// dig walks maps and lists: dig(v, "spec", "containers", 0, "name").
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func TestKubernetes(t *testing.T) {
	objs := k8sObjects(t)
	dep := objs["Deployment/seamguard"]
	if dep == nil {
		t.Fatalf("no Deployment seamguard among %v", slices.Sorted(maps.Keys(objs)))
	}
	if r := dig(dep, "spec", "replicas"); r != 2 {
		t.Errorf("replicas %v, want 2", r)
	}
	sel := fmt.Sprint(dig(dep, "spec", "selector", "matchLabels"))
	if sel != fmt.Sprint(dig(dep, "spec", "template", "metadata", "labels")) {
		t.Errorf("the selector %s does not match the pod labels", sel)
	}
	ctr, _ := dig(dep, "spec", "template", "spec", "containers", 0).(map[string]any)
	if ctr == nil {
		t.Fatal("the Deployment has no container")
	}

	// ports and probes
	ports := map[string]int{}
	for _, p := range asList(ctr["ports"]) {
		ports[fmt.Sprint(dig(p, "name"))], _ = dig(p, "containerPort").(int)
	}
	probePort := func(probe string) (string, int) {
		path, _ := dig(ctr, probe, "httpGet", "path").(string)
		switch p := dig(ctr, probe, "httpGet", "port").(type) {
		case int:
			return path, p
		case string:
			return path, ports[p]
		}
		return path, 0
	}
	for probe, want := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz", "startupProbe": "/healthz"} {
		path, port := probePort(probe)
		if path != want {
			t.Errorf("%s GETs %q, want %s", probe, path, want)
		}
		if port == 0 {
			t.Errorf("%s has no port the container declares", probe)
		}
	}
	_, healthPort := probePort("readinessProbe")

	// configuration: the ConfigMap and Secret it reads, and their variables
	var env []string
	var cm, secret map[string]any
	for _, from := range asList(ctr["envFrom"]) {
		if n := dig(from, "configMapRef", "name"); n != nil {
			if cm = objs["ConfigMap/"+fmt.Sprint(n)]; cm == nil {
				t.Errorf("envFrom names ConfigMap %v, which deploy/kubernetes does not define", n)
			}
		}
		if n := dig(from, "secretRef", "name"); n != nil {
			if secret = objs["Secret/"+fmt.Sprint(n)]; secret == nil {
				t.Errorf("envFrom names Secret %v, which deploy/kubernetes does not define", n)
			}
		}
	}
	if cm == nil || secret == nil {
		t.Fatal("the container must read its settings from a ConfigMap and its credentials from a Secret")
	}
	data, _ := cm["data"].(map[string]any)
	for k := range data {
		env = append(env, k)
	}
	sdata, _ := secret["stringData"].(map[string]any)
	for k := range sdata {
		env = append(env, k)
		if data[k] != nil {
			t.Errorf("%s is in both the ConfigMap and the Secret", k)
		}
	}
	for _, e := range asList(ctr["env"]) {
		env = append(env, fmt.Sprint(dig(e, "name")))
	}
	checkSeamguardEnv(t, "deploy/kubernetes", env)
	if sdata["SEAMGUARD_PASSWORD"] == nil && sdata["SEAMGUARD_CREDS"] == nil {
		t.Errorf("the Secret holds neither SEAMGUARD_PASSWORD nor SEAMGUARD_CREDS")
	}
	if data["SEAMGUARD_USER"] != "processor" || data["SEAMGUARD_REPLICAS"] != "3" {
		t.Errorf("ConfigMap: SEAMGUARD_USER %v, SEAMGUARD_REPLICAS %v; want processor and 3", data["SEAMGUARD_USER"], data["SEAMGUARD_REPLICAS"])
	}
	if _, port, err := net.SplitHostPort(fmt.Sprint(data["SEAMGUARD_HEALTH_LISTEN"])); err != nil || port != strconv.Itoa(healthPort) {
		t.Errorf("SEAMGUARD_HEALTH_LISTEN %v does not listen on the probes' port %d", data["SEAMGUARD_HEALTH_LISTEN"], healthPort)
	}
	// Prometheus scrapes /metrics, which serve puts beside the probes.
	ann, _ := dig(dep, "spec", "template", "metadata", "annotations").(map[string]any)
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/path"] != "/metrics" || ann["prometheus.io/port"] != strconv.Itoa(healthPort) {
		t.Errorf("pod annotations %v: want prometheus.io/scrape \"true\", path /metrics and port %d (the probes' port, where serve puts /metrics)", ann, healthPort)
	}
	var hosts []string
	for _, u := range strings.Split(fmt.Sprint(data["SEAMGUARD_NATS_URL"]), ",") {
		pu, err := url.Parse(u)
		if err != nil || pu.Scheme != "nats" || pu.Port() != "4222" {
			t.Errorf("SEAMGUARD_NATS_URL entry %q is not nats://HOST:4222", u)
			continue
		}
		hosts = append(hosts, pu.Hostname())
	}
	if want := []string{"nats-0.nats-headless", "nats-1.nats-headless", "nats-2.nats-headless"}; !slices.Equal(hosts, want) {
		t.Errorf("SEAMGUARD_NATS_URL names %v; the Helm release \"nats\" with 3 replicas gives %v", hosts, want)
	}
	var monitors []string
	for _, u := range strings.Split(fmt.Sprint(data["SEAMGUARD_NATS_MONITOR_URL"]), ",") {
		pu, err := url.Parse(u)
		if err != nil || pu.Scheme != "http" || pu.Port() != "8222" {
			t.Errorf("SEAMGUARD_NATS_MONITOR_URL entry %q is not http://HOST:8222 (the Helm values' monitor port)", u)
			continue
		}
		monitors = append(monitors, pu.Hostname())
	}
	if !slices.Equal(monitors, hosts) {
		t.Errorf("SEAMGUARD_NATS_MONITOR_URL names %v; want the servers of SEAMGUARD_NATS_URL, %v", monitors, hosts)
	}

	// hardening and resources
	for path, want := range map[string]any{
		"securityContext.allowPrivilegeEscalation": false,
		"securityContext.readOnlyRootFilesystem":   true,
		"securityContext.runAsNonRoot":             true,
	} {
		if got := dig(ctr, toPath(path)...); got != want {
			t.Errorf("container %s is %v, want %v", path, got, want)
		}
	}
	if dig(dep, "spec", "template", "spec", "securityContext", "runAsNonRoot") != true {
		t.Errorf("the pod does not require a non-root user")
	}
	for _, path := range []string{"resources.requests.cpu", "resources.requests.memory", "resources.limits.memory"} {
		if dig(ctr, toPath(path)...) == nil {
			t.Errorf("container sets no %s", path)
		}
	}
	if args := fmt.Sprint(ctr["args"]); args != "[serve]" {
		t.Errorf("container args %s, want [serve]", args)
	}
}

func asList(v any) []any { l, _ := v.([]any); return l }

func toPath(s string) []any {
	var p []any
	for _, k := range strings.Split(s, ".") {
		p = append(p, k)
	}
	return p
}

func TestHelmValues(t *testing.T) {
	var v map[string]any
	decodeYAML(t, filepath.Join("helm", "nats-values.yaml"), &v)
	for path, want := range map[string]any{
		"config.cluster.enabled":                 true,
		"config.cluster.replicas":                3,
		"config.jetstream.enabled":               true,
		"config.jetstream.fileStore.enabled":     true,
		"config.jetstream.fileStore.pvc.enabled": true,
		"config.monitor.enabled":                 true,
		"config.jetstream.merge.sync_interval":   "always",
		"container.image.repository":             "nats",
	} {
		if got := dig(v, toPath(path)...); got != want {
			t.Errorf("%s is %v, want %v", path, got, want)
		}
	}
	if dig(v, toPath("config.jetstream.fileStore.pvc.size")...) == nil {
		t.Errorf("no PVC size for JetStream")
	}
	setPasswords(t)
	opts := natsConfig(t, "standalone.conf", nil)
	if p := dig(v, toPath("config.monitor.port")...); p != opts.HTTPPort {
		t.Errorf("monitor port %v, deploy/nats uses %d", p, opts.HTTPPort)
	}

	// the same image as the compose file
	c := loadCompose(t)
	nats, _ := composeServices(t, c)
	if len(nats) > 0 {
		if img := "nats:" + fmt.Sprint(dig(v, "container", "image", "tag")); img != c.Services[nats[0]].Image {
			t.Errorf("Helm runs %s, docker-compose.yaml %s", img, c.Services[nats[0]].Image)
		}
	}

	// the accounts: deploy/nats/accounts.conf, included, verbatim
	if inc := dig(v, "config", "merge", "$include"); inc != "accounts.conf" {
		t.Errorf("config.merge.$include is %v, want accounts.conf", inc)
	}
	for _, name := range []string{"accounts.conf", "permissions.conf"} {
		want, err := os.ReadFile(filepath.Join("nats", name))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := dig(v, "configMap", "merge", "data", name).(string)
		if got != string(want) {
			t.Errorf("configMap.merge.data[%s] differs from deploy/nats/%s; copy the file into the values (indented 8 spaces)", name, name)
		}
	}

	// the passwords come from the Secret of deploy/kubernetes
	objs := k8sObjects(t)
	for _, name := range []string{"NATS_AGENT_PASSWORD", "NATS_PROCESSOR_PASSWORD", "NATS_RESPONDER_PASSWORD", "NATS_OPERATOR_PASSWORD", "NATS_FORWARDER_PASSWORD"} {
		ref := dig(v, "container", "env", name, "valueFrom", "secretKeyRef")
		sname, key := fmt.Sprint(dig(ref, "name")), fmt.Sprint(dig(ref, "key"))
		s := objs["Secret/"+sname]
		if s == nil {
			t.Errorf("container.env.%s reads Secret %s, which deploy/kubernetes does not define", name, sname)
			continue
		}
		if dig(s, "stringData", key) == nil {
			t.Errorf("container.env.%s reads key %s, which Secret %s lacks", name, key, sname)
		}
	}
}

// TestReadmeNamesTheFiles keeps deploy/README.md honest about what exists.
func TestReadmeNamesTheFiles(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range regexp.MustCompile("`((?:deploy/)[A-Za-z0-9_./-]+\\.[a-z]+)`").FindAllSubmatch(b, -1) {
		if _, err := os.Stat(filepath.Join(root, string(path[1]))); err != nil {
			t.Errorf("deploy/README.md names %s, which does not exist", path[1])
		}
	}
	for _, want := range [][]byte{[]byte("docker compose up"), []byte("LeaseTTL"), []byte("Docker")} {
		if !bytes.Contains(b, want) {
			t.Errorf("deploy/README.md does not mention %s", want)
		}
	}
	// The partition count it describes is the one deploy/kubernetes sets.
	n := kubernetesPartitions(t)
	for _, want := range []string{
		fmt.Sprintf("`SEAMGUARD_PARTITIONS: \"%d\"`", n),
		fmt.Sprintf("{{partition(%d,2)}}", n),
		fmt.Sprintf("`seamguard-p0`..`seamguard-p%d`", n-1),
	} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("deploy/README.md does not say %s, what deploy/kubernetes/configmap.yaml sets", want)
		}
	}
	for _, m := range regexp.MustCompile(`SEAMGUARD_PARTITIONS: "(\d+)"|partition\((\d+),2\)`).FindAllSubmatch(b, -1) {
		got := string(m[1]) + string(m[2])
		if got != strconv.Itoa(n) {
			t.Errorf("deploy/README.md says %s partitions; deploy/kubernetes/configmap.yaml sets %d", got, n)
		}
	}
}
