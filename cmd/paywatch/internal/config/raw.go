package config

import (
	"fmt"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"
)

// The raw* types mirror the YAML document key for key.

type rawConfig struct {
	Listen           string        `yaml:"listen"`
	DatabaseURLEnv   string        `yaml:"database_url_env"`
	DatabaseAPIConns rawCount      `yaml:"database_api_conns"`
	APIKeys          []rawAPIKey   `yaml:"api_keys"`
	Orders           rawOrders     `yaml:"orders"`
	Reconciler       rawReconciler `yaml:"reconciler"`
	Webhooks         rawWebhooks   `yaml:"webhooks"`
	Networks         []rawNetwork  `yaml:"networks"`
}

type rawAPIKey struct {
	Name   string `yaml:"name"`
	Role   string `yaml:"role"`
	KeyEnv string `yaml:"key_env"`
}

type rawOrders struct {
	DefaultExpiry    time.Duration `yaml:"default_expiry"`
	MaxExpiry        time.Duration `yaml:"max_expiry"`
	MonitoringWindow time.Duration `yaml:"monitoring_window"`
	PaidGrace        time.Duration `yaml:"paid_grace"`
}

type rawReconciler struct {
	Schedule string `yaml:"schedule"`
}

type rawWebhooks struct {
	URL                  string        `yaml:"url"`
	SecretEnv            string        `yaml:"secret_env"`
	AllowPrivateNetworks bool          `yaml:"allow_private_networks"`
	MaxRetryAge          time.Duration `yaml:"max_retry_age"`
}

type rawNetwork struct {
	Name          string           `yaml:"name"`
	Family        string           `yaml:"family"`
	RPCURLs       []string         `yaml:"rpc_urls"`
	RPCUserEnv    string           `yaml:"rpc_user_env"`
	RPCPassEnv    string           `yaml:"rpc_pass_env"`
	RPCCookieFile string           `yaml:"rpc_cookie_file"`
	RPCCertFile   string           `yaml:"rpc_cert_file"`
	ChainID       uint64           `yaml:"chain_id"`
	Chain         string           `yaml:"chain"`
	Confirmations rawConfirmations `yaml:"confirmations"`
	PollInterval  time.Duration    `yaml:"poll_interval"`
	StartBlock    rawStartBlock    `yaml:"start_block"`
	Assets        []rawAsset       `yaml:"assets"`
	line          int              // filled from the node tree: node.Decode would lose KnownFields
}

type rawAsset struct {
	Symbol      string     `yaml:"symbol"`
	Native      bool       `yaml:"native"`
	Contract    string     `yaml:"contract"`
	Decimals    *int       `yaml:"decimals"`
	UniqueStep  string     `yaml:"unique_step"`
	UniqueSlots int        `yaml:"unique_slots"`
	Receive     rawReceive `yaml:"receive"`
	MaxAmount   string     `yaml:"max_amount"`
	Dust        string     `yaml:"dust"`
	// VerifyBalance is the fake-deposit guard of an EVM token (default on).
	VerifyBalance *bool `yaml:"verify_balance"`
	line          int
}

// setLines records where each network and asset starts in the document, so
// that validation messages can point at them.
func setLines(doc *yaml.Node, raw *rawConfig) {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return
	}
	nets := mapValue(doc.Content[0], "networks")
	if nets == nil || nets.Kind != yaml.SequenceNode {
		return
	}
	for i, n := range nets.Content {
		if i >= len(raw.Networks) {
			return
		}
		raw.Networks[i].line = n.Line
		assets := mapValue(n, "assets")
		if assets == nil || assets.Kind != yaml.SequenceNode {
			continue
		}
		for j, a := range assets.Content {
			if j < len(raw.Networks[i].Assets) {
				raw.Networks[i].Assets[j].line = a.Line
			}
		}
	}
}

func mapValue(m *yaml.Node, key string) *yaml.Node {
	if m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

type rawReceive struct {
	Addresses  []string `yaml:"addresses"`
	XPub       string   `yaml:"xpub"`
	ScriptType string   `yaml:"script_type"`
	GapLimit   *int     `yaml:"gap_limit"`
}

// rawConfirmations is a block count or the word "finalized".
type rawConfirmations struct {
	set       bool
	count     int
	finalized bool
}

func (c *rawConfirmations) UnmarshalYAML(node *yaml.Node) error {
	c.set = true
	if node.Kind == yaml.ScalarNode && node.Value == "finalized" {
		c.finalized = true
		return nil
	}
	n, err := strconv.Atoi(node.Value)
	if node.Kind != yaml.ScalarNode || err != nil || n < 1 || n > 10000 {
		return fmt.Errorf("line %d: confirmations must be a number from 1 to 10000 or \"finalized\", not %q", node.Line, node.Value)
	}
	c.count = n
	return nil
}

// rawStartBlock is a block number or the word "latest".
type rawStartBlock struct {
	set    bool
	number uint64
	latest bool
}

func (s *rawStartBlock) UnmarshalYAML(node *yaml.Node) error {
	s.set = true
	if node.Kind == yaml.ScalarNode && node.Value == "latest" {
		s.latest = true
		return nil
	}
	n, err := strconv.ParseUint(node.Value, 10, 63)
	if node.Kind != yaml.ScalarNode || err != nil {
		return fmt.Errorf("line %d: start_block must be a block number or \"latest\", not %q", node.Line, node.Value)
	}
	s.number = n
	return nil
}

// rawCount is a whole number given in the file: a fraction is refused, not
// cut to its integer part, and set tells a 0 given from a key left out.
type rawCount struct {
	set bool
	n   int
}

func (c *rawCount) UnmarshalYAML(node *yaml.Node) error {
	n, err := strconv.Atoi(node.Value)
	if node.Kind != yaml.ScalarNode || node.Tag != "!!int" || err != nil {
		return fmt.Errorf("line %d: %q is not a whole number", node.Line, node.Value)
	}
	c.set, c.n = true, n
	return nil
}
