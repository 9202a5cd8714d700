// Package config reads and validates paywatch's YAML configuration. Every
// key is known (an unknown one is an error naming it and its line), secrets
// come from environment variables named by *_env keys, and every problem is
// reported at once, before anything touches the database.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/paywatch/paywatch"
)

// Role is what an API key may do.
type Role string

// The API roles.
const (
	RoleStorefront Role = "storefront"
	RoleOperator   Role = "operator"
)

// APIKey is one configured key; Key is its secret value.
type APIKey struct {
	Name string
	Role Role
	Key  string
}

// Orders holds the timing rules of order dossiers.
type Orders struct {
	DefaultExpiry    time.Duration
	MaxExpiry        time.Duration
	MonitoringWindow time.Duration
	PaidGrace        time.Duration
}

// Config is the validated configuration.
type Config struct {
	Listen      string
	DatabaseURL string
	// DatabaseAPIConns bounds the connections the API's requests share
	// (the reconciler, the scanners and the webhook sender have a pool of
	// their own).
	DatabaseAPIConns int
	APIKeys          []APIKey
	Orders           Orders
	// ReconcilerSchedule is a robfig/cron spec.
	ReconcilerSchedule string
	WebhookURL         string
	WebhookSecret      string
	// WebhookAllowPrivate lets webhooks go to loopback, private and
	// link-local addresses; WebhookMaxRetryAge is how long a delivery is
	// retried.
	WebhookAllowPrivate bool
	WebhookMaxRetryAge  time.Duration
	Networks            []*paywatch.Network
}

// Network returns the configured network with the given name, or nil.
func (c *Config) Network(name string) *paywatch.Network {
	for _, n := range c.Networks {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Load reads the file at path; getenv resolves the *_env keys (os.Getenv
// when nil).
func Load(path string, getenv func(string) string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cfg, err := Parse(data, getenv)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Parse decodes and validates a configuration document.
func Parse(data []byte, getenv func(string) string) (*Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var raw rawConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the configuration is empty")
		}
		return nil, fmt.Errorf("%v", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("the configuration holds more than one YAML document")
	}
	var tree yaml.Node
	if err := yaml.Unmarshal(data, &tree); err == nil {
		setLines(&tree, &raw)
	}
	v := &validator{getenv: getenv}
	cfg := v.config(&raw)
	if len(v.problems) > 0 {
		return nil, errors.Join(v.problems...)
	}
	return cfg, nil
}

// DefaultBitcoinDust is the default dust of a Bitcoin asset, in satoshis:
// outputs below it are flagged and pay no order (as they would not be
// relayed by default).
const DefaultBitcoinDust = 546
