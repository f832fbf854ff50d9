package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
)

// signingKeyEnv holds the processor's signing key seed itself, for
// deployments that pass secrets through the environment.
const signingKeyEnv = "SEAMGUARD_SIGNING_KEY"

// trustedKeysEnv lists the public keys the tools trust, separated by
// commas or white space, when no --trust-key is given.
const trustedKeysEnv = "SEAMGUARD_TRUSTED_KEYS"

// signingKey returns the seed serve signs with and says where it came from:
// the file given, else the SEAMGUARD_SIGNING_KEY seed, else the key kept in
// dataDir (made there at first start). The seed is never logged.
func signingKey(file, dataDir string, log *slog.Logger) (string, error) {
	env, inEnv := os.LookupEnv(signingKeyEnv)
	switch {
	case file != "" && inEnv && env != "":
		return "", fmt.Errorf("%w: both --signing-key-file and %s are set; give the signing key one way", errUsage, signingKeyEnv)
	case file != "":
		st, err := os.Stat(file)
		if err != nil {
			return "", fmt.Errorf("--signing-key-file: %w", err)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--signing-key-file: %w", err)
		}
		s, err := attest.NewSigner(b)
		if err != nil {
			return "", fmt.Errorf("--signing-key-file %s: %w", file, err)
		}
		if st.Mode().Perm()&0o077 != 0 {
			log.Warn("the signing key file can be read by others than its owner: whoever reads it can sign verdicts as this processor; chmod 600 it", "file", file, "mode", st.Mode().Perm().String())
		}
		log.Info("signing verdicts", "signing_key", s.PublicKey(), "from", file)
		return string(s.Seed()), nil
	case inEnv && env != "":
		s, err := attest.NewSigner([]byte(env))
		if err != nil {
			return "", fmt.Errorf("%w: %s: %v", errUsage, signingKeyEnv, err)
		}
		log.Info("signing verdicts", "signing_key", s.PublicKey(), "from", signingKeyEnv)
		return string(s.Seed()), nil
	}
	path := filepath.Join(dataDir, attest.KeyFileName)
	s, created, err := attest.LoadOrCreate(path)
	if err != nil {
		return "", err
	}
	if created {
		log.Info("made a signing key: subscribers verify verdicts with its public key (--trust-key)", "signing_key", s.PublicKey(), "file", path)
	} else {
		log.Info("signing verdicts", "signing_key", s.PublicKey(), "from", path)
	}
	return string(s.Seed()), nil
}

// trustFlags are the public keys a tool that reads verdicts trusts.
type trustFlags struct {
	keys  []string
	given bool
}

func (t *trustFlags) String() string { return strings.Join(t.keys, ",") }

func (t *trustFlags) Set(v string) error {
	if _, err := attest.ParseKeys(v); err != nil {
		return err
	}
	t.keys = append(t.keys, v)
	t.given = true
	return nil
}

func (t *trustFlags) register(fs *flag.FlagSet) {
	fs.Var(t, "trust-key", "a public NKey (N…) whose signature makes a verdict genuine: the processor's, as serve logs it (signing_key); repeat it, or separate keys with commas, to trust several (a rotation). Default: $"+trustedKeysEnv+". Without any, a verdict's signature is checked against the key it names, which proves nothing about who made it")
}

// verifier returns the verifier of the keys given (or, with none, those of
// SEAMGUARD_TRUSTED_KEYS), and tells w when it trusts no key in particular.
func (t *trustFlags) verifier(subj events.Subjects, w io.Writer, name string) (*attest.Verifier, error) {
	keys := t.keys
	if !t.given {
		if env := os.Getenv(trustedKeysEnv); env != "" {
			keys = []string{env}
		}
	}
	v, err := attest.NewVerifier(subj, keys...)
	if err != nil {
		src := "--trust-key"
		if !t.given {
			src = trustedKeysEnv
		}
		return nil, fmt.Errorf("%w: %s: %v", errUsage, src, err)
	}
	if !v.Trusting() {
		fmt.Fprintf(w, "%s: warning: no trusted key (--trust-key or %s): each verdict's signature is checked against the signer it names, which is not verified as this deployment's processor\n", name, trustedKeysEnv)
	}
	return v, nil
}

// describeFailure is one line about a message that failed verification.
func describeFailure(subject string, err error) string {
	return fmt.Sprintf("UNATTRIBUTED %s: %s", subject, err)
}
