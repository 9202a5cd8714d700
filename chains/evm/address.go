// Package evm watches EVM networks (Ethereum, Polygon, BSC, Arbitrum,
// Base, ...) through go-ethereum's ethclient: ERC-20 Transfer logs of the
// configured token contracts and native coin transactions.
package evm

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/ethereum/go-ethereum/common"
)

var hexAddress = regexp.MustCompile(`^0x[0-9a-fA-F]{40}$`)

// ParseAddress validates an EVM address and returns its EIP-55 checksummed
// form. An all-lowercase or all-uppercase address carries no checksum and is
// accepted; a mixed-case one must match its checksum exactly.
func ParseAddress(s string) (string, error) {
	if !hexAddress.MatchString(s) {
		return "", fmt.Errorf("address %q is malformed (want 0x and 40 hex digits)", s)
	}
	sum := common.HexToAddress(s).Hex()
	body := s[2:]
	if body != strings.ToLower(body) && body != strings.ToUpper(body) && s != sum {
		return "", fmt.Errorf("address %q has a wrong EIP-55 checksum (did you mean %s?)", s, sum)
	}
	return sum, nil
}

var hexTxHash = regexp.MustCompile(`^0x[0-9a-fA-F]{64}$`)

// ValidTxHash reports whether s is a 0x-prefixed 32-byte transaction hash.
func ValidTxHash(s string) bool { return hexTxHash.MatchString(s) }
