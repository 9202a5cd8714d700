package ledger

// Every account name is built here, in Go for single entries and in SQL
// for the set-based statements and the checks that compare the ledger with
// the transfers; a test holds the two together.

// The kinds of accounts, as the prefixes of their names.
const (
	WalletPrefix      = "wallet:"       // wallet:<network>:<address>
	SuspensePrefix    = "suspense:"     // suspense:<network>:<asset>
	OrderPrefix       = "order:"        // order:<order id>
	SettledPrefix     = "settled:"      // settled:<network>:<asset>
	RefundsOwedPrefix = "refunds_owed:" // refunds_owed:<network>:<asset>
)

// Wallet names the account of what arrived at a receiving address.
func Wallet(network, address string) string { return WalletPrefix + network + ":" + address }

// Suspense names the account of what arrived and is attributed to no order.
func Suspense(network, asset string) string { return SuspensePrefix + network + ":" + asset }

// Order names the account of what is attributed to an order not closed.
func Order(id string) string { return OrderPrefix + id }

// Settled names the shop's revenue in an asset.
func Settled(network, asset string) string { return SettledPrefix + network + ":" + asset }

// RefundsOwed names what is owed back to customers after refunds.
func RefundsOwed(network, asset string) string { return RefundsOwedPrefix + network + ":" + asset }

// WalletSQL is Wallet of two SQL expressions.
func WalletSQL(network, address string) string { return joinSQL(WalletPrefix, network, address) }

// SuspenseSQL is Suspense of two SQL expressions.
func SuspenseSQL(network, asset string) string { return joinSQL(SuspensePrefix, network, asset) }

// OrderSQL is Order of an SQL expression.
func OrderSQL(id string) string { return "'" + OrderPrefix + "' || " + id }

// SettledSQL is Settled of two SQL expressions.
func SettledSQL(network, asset string) string { return joinSQL(SettledPrefix, network, asset) }

// KindLikeSQL is an SQL LIKE pattern matching every account of a kind.
func KindLikeSQL(prefix string) string { return "'" + prefix + "%'" }

func joinSQL(prefix, a, b string) string { return "'" + prefix + "' || " + a + " || ':' || " + b }
