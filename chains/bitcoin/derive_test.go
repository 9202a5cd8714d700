package bitcoin

import (
	"crypto/pbkdf2"
	"crypto/sha512"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/btcsuite/btcd/btcutil/hdkeychain"
	"github.com/btcsuite/btcd/chaincfg"
)

const mnemonic = "abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon abandon about"

// accountKey derives the account-level extended public key m/purpose'/coin'/0'
// of the BIP39 test mnemonic and renders it with the given version bytes.
func accountKey(t *testing.T, purpose, coin uint32, version string) string {
	t.Helper()
	seed, err := pbkdf2.Key(sha512.New, mnemonic, []byte("mnemonic"), 2048, 64)
	if err != nil {
		t.Fatal(err)
	}
	params := &chaincfg.MainNetParams
	if coin == 1 {
		params = &chaincfg.TestNet3Params
	}
	k, err := hdkeychain.NewMaster(seed, params)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []uint32{purpose, coin, 0} {
		if k, err = k.Derive(hdkeychain.HardenedKeyStart + i); err != nil {
			t.Fatal(err)
		}
	}
	pub, err := k.Neuter()
	if err != nil {
		t.Fatal(err)
	}
	v, _ := hex.DecodeString(version)
	pub, err = pub.CloneWithVersion(v)
	if err != nil {
		t.Fatal(err)
	}
	return pub.String()
}

const bip84zpub = "zpub6rFR7y4Q2AijBEqTUquhVz398htDFrtymD9xYYfG1m4wAcvPhXNfE3EfH1r1ADqtfSdVCToUG868RvUUkgDKf31mGDtKsAYz2oz2AGutZYs"

// The published vectors of BIP84, BIP49, BIP44 and BIP86 for the test mnemonic.
func TestDeriverPublishedVectors(t *testing.T) {
	if got := accountKey(t, 84, 0, "04b24746"); got != bip84zpub {
		t.Fatalf("seed derivation gives %s, want the BIP84 zpub", got)
	}
	cases := []struct {
		name, key, chain, script string
		want                     []string
	}{
		{"BIP84", bip84zpub, "mainnet", "", []string{
			"bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu", "bc1qnjg0jd8228aq7egyzacy8cys3knf9xvrerkf9g"}},
		{"BIP49", accountKey(t, 49, 1, "044a5262"), "testnet", "", []string{"2Mww8dCYPUpKHofjgcXcBCEGmniw9CoaiD2"}},
		{"BIP44", accountKey(t, 44, 0, "0488b21e"), "mainnet", "", []string{"1LqBGSKuX5yYUonjxT5qGfpUsXKYYWeabA"}},
		{"BIP86", accountKey(t, 86, 0, "0488b21e"), "mainnet", P2TR, []string{
			"bc1p5cyxnuxmeuwuvkwfem96lqzszd02n6xdcjrs20cac6yqjjwudpxqkedrcr"}},
	}
	for _, c := range cases {
		d, err := NewDeriver(c.key, c.chain, c.script)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for i, want := range c.want {
			got, err := d.Address(uint32(i))
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if got != want {
				t.Errorf("%s m/0/%d = %s, want %s", c.name, i, got, want)
			}
		}
	}
}

func TestDeriverRegtestUsesBcrt(t *testing.T) {
	vpub := accountKey(t, 84, 1, "045f1cf6")
	d, err := NewDeriver(vpub, "regtest", "")
	if err != nil {
		t.Fatal(err)
	}
	a, err := d.Address(0)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(a, "bcrt1q") {
		t.Fatalf("regtest address %s, want bcrt1q…", a)
	}
	if err := ValidateAddress(a, "regtest"); err != nil {
		t.Fatal(err)
	}
	if err := ValidateAddress(a, "mainnet"); err == nil {
		t.Fatal("regtest address accepted on mainnet")
	}
}

func TestDeriverRejects(t *testing.T) {
	tpub := accountKey(t, 44, 1, "043587cf")
	vpub := accountKey(t, 84, 1, "045f1cf6")
	corrupt := []byte(bip84zpub)
	corrupt[50] ^= 1
	cases := []struct{ key, chain, script, want string }{
		{"vpub...", "regtest", "", "malformed"},
		{string(corrupt), "mainnet", "", "malformed"},
		{bip84zpub, "regtest", "", "does not fit chain"},
		{vpub, "mainnet", "", "does not fit chain"},
		{vpub, "regtest", P2PKH, "does not fit"},
		{vpub, "regtest", P2TR, "does not fit"},
		{tpub, "regtest", "p2wsh", "unknown script type"},
		{tpub, "moonnet", "", "unknown bitcoin chain"},
		{"xprv9s21ZrQH143K3GJpoapnV8SFfukcVBSfeCficPSGfubmSFDxo1kuHnLisriDvSnRRuL2Qrg5ggqHKNVpxR86QEC8w35uxmGoggxtQTPvfUu", "mainnet", "", "private"},
	}
	for _, c := range cases {
		_, err := NewDeriver(c.key, c.chain, c.script)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewDeriver(%.12s, %s, %q) = %v, want error with %q", c.key, c.chain, c.script, err, c.want)
		}
	}
	// A plain tpub may be asked to make native SegWit addresses.
	if d, err := NewDeriver(tpub, "regtest", P2WPKH); err != nil || d.ScriptType() != P2WPKH {
		t.Fatalf("tpub as p2wpkh: %v", err)
	}
}

func BenchmarkDeriverAddress(b *testing.B) {
	d, err := NewDeriver(bip84zpub, "mainnet", "")
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; b.Loop(); i++ {
		if _, err := d.Address(uint32(i % 100000)); err != nil {
			b.Fatal(err)
		}
	}
}
