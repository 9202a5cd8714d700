//go:build !nodev

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/ethclient"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/evm/devchain"
)

func devPayCommand(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("dev pay", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() { fmt.Fprint(e.stderr, devUsage) }
	amount := fs.String("amount", "", "amount to send, in the asset's units (default: the order's pay_amount)")
	noFollow := fs.Bool("no-follow", false, "send and exit, without following the order")
	// The order id may come before or after the flags.
	var id string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		id, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if id == "" && fs.NArg() == 1 {
		id = fs.Arg(0)
	} else if fs.NArg() > 0 || id == "" {
		return usageError{errors.New("usage: paywatch dev pay ORDER_ID [--amount X] [--no-follow]")}
	}
	path := devStatePath(e.getenv)
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("is paywatch dev running? %w", err)
	}
	var st devState
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	order, err := devCall(ctx, st.API, st.StorefrontKey, "GET", "/v1/orders/"+id, "")
	if err != nil {
		return err
	}
	asset, _ := order["asset"].(string)
	a, ok := st.Assets[asset]
	if !ok || order["network"] != a.Network {
		return fmt.Errorf("order %s is on %v %s: the faucets pay devnet ETH and USDT (and devbtc BTC with --bitcoin) only",
			id, order["network"], asset)
	}
	send, _ := order["pay_amount"].(string)
	if *amount != "" {
		send = *amount
	}
	units, err := paywatch.ParseUnits(send, a.Decimals, asset, nil)
	if err != nil {
		return usageError{err}
	}
	address, _ := order["pay_address"].(string)
	var hash string
	if a.Network == "devbtc" {
		if !units.IsInt64() {
			return usageError{fmt.Errorf("%s BTC is too much", send)}
		}
		hash, err = devPayBitcoin(ctx, st, address, units.Int64())
	} else {
		var h common.Hash
		h, err = devSend(ctx, st, a, common.HexToAddress(address), units)
		hash = h.Hex()
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "sent %s %s to %s in %s\n", paywatch.FormatUnits(units, a.Decimals), asset, address, hash)
	// Then click "I've paid" with the hash, as a customer would: an amount
	// other than pay_amount is tied to the order by this claim alone.
	if _, err := devCall(ctx, st.API, st.StorefrontKey, "POST", "/v1/orders/"+id+"/paid",
		fmt.Sprintf(`{"tx_hash":%q}`, hash)); err != nil {
		return err
	}
	if *noFollow {
		return nil
	}
	return devFollow(ctx, e, st, a, id, order)
}

// devSend sends units of an asset from the faucet.
func devSend(ctx context.Context, st devState, a devAsset, to common.Address, units *big.Int) (common.Hash, error) {
	key, err := crypto.HexToECDSA(st.FaucetKey)
	if err != nil {
		return common.Hash{}, fmt.Errorf("faucet key: %w", err)
	}
	client, err := ethclient.DialContext(ctx, st.RPC)
	if err != nil {
		return common.Hash{}, fmt.Errorf("development chain: %w", err)
	}
	defer client.Close()
	nonce, err := client.PendingNonceAt(ctx, devchain.Address(key))
	if err != nil {
		return common.Hash{}, fmt.Errorf("development chain: %w", err)
	}
	tx := &types.DynamicFeeTx{ChainID: big.NewInt(devchain.ChainID), Nonce: nonce, GasTipCap: big.NewInt(1e9),
		GasFeeCap: big.NewInt(100e9), Gas: 21_000, To: &to, Value: units}
	if a.Contract != "" {
		data, err := devchain.TransferData(to, units)
		if err != nil {
			return common.Hash{}, err
		}
		contract := common.HexToAddress(a.Contract)
		tx.To, tx.Value, tx.Data = &contract, nil, data
		if tx.Gas, err = client.EstimateGas(ctx, ethereum.CallMsg{From: devchain.Address(key), To: &contract, Data: data}); err != nil {
			return common.Hash{}, fmt.Errorf("the token transfer would fail: %w", err)
		}
	}
	signed, err := types.SignTx(types.NewTx(tx), types.LatestSignerForChainID(big.NewInt(devchain.ChainID)), key)
	if err != nil {
		return common.Hash{}, err
	}
	if err := client.SendTransaction(ctx, signed); err != nil {
		return common.Hash{}, fmt.Errorf("send: %w", err)
	}
	return signed.Hash(), nil
}

// devFollow long-polls the order and prints each status it takes, until
// one that no payment changes by itself (or a minute passes).
func devFollow(ctx context.Context, e *env, st devState, a devAsset, id string, order map[string]any) error {
	status, _ := order["status"].(string)
	fmt.Fprintf(e.stdout, "order %s: %s", id, status)
	defer fmt.Fprintln(e.stdout)
	deadline := time.Now().Add(time.Minute)
	etag := ""
	for time.Now().Before(deadline) {
		req, err := http.NewRequestWithContext(ctx, "GET", st.API+"/v1/orders/"+id+"?wait=30s", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+st.StorefrontKey)
		if etag != "" {
			req.Header.Set("If-None-Match", etag)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		var o map[string]any
		if resp.StatusCode == http.StatusOK {
			err = json.NewDecoder(resp.Body).Decode(&o)
		}
		resp.Body.Close()
		if err != nil {
			return err
		}
		etag = resp.Header.Get("ETag")
		if o == nil {
			continue
		}
		if s, _ := o["status"].(string); s != status {
			status = s
			fmt.Fprintf(e.stdout, " → %s", status)
			if r, ok := o["dispute_reason"].(string); ok {
				fmt.Fprintf(e.stdout, " (%s)", r)
			}
		}
		switch status {
		case "settled", "disputed", "expired", "cancelled", "refunded":
			return nil
		}
		// Confirmed but short, on an address of its own: the order waits
		// for the rest until it expires. (On a shared address, where the
		// amount tells the orders apart, the next pass disputes it.)
		if a.PerOrder && confirmedShort(o, a) {
			fmt.Fprintf(e.stdout, " (received %v of %v %v, confirmed; the rest may come until %v)",
				o["received_amount"], o["pay_amount"], o["asset"], o["expires_at"])
			return nil
		}
	}
	return fmt.Errorf("order %s is still %s after a minute", id, status)
}

// confirmedShort reports whether the order's payments are confirmed and
// come to less than its pay amount (more than nothing).
func confirmedShort(o map[string]any, a devAsset) bool {
	conf, _ := o["confirmations"].(float64)
	need, _ := o["required_confirmations"].(float64)
	received, _ := o["received_amount"].(string)
	pay, _ := o["pay_amount"].(string)
	asset, _ := o["asset"].(string)
	r, err1 := paywatch.ParseUnits(received, a.Decimals, asset, nil)
	p, err2 := paywatch.ParseUnits(pay, a.Decimals, asset, nil)
	return err1 == nil && err2 == nil && r.Sign() > 0 && r.Cmp(p) < 0 && need > 0 && conf >= need
}
