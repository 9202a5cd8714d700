// Package paywatch holds the domain of the paywatch daemon: networks and
// assets, exact amounts, order dossiers, transfers and the error codes the
// API speaks. It imports no chain client and no database driver; the
// adapters in chains/, the stores and the HTTP API translate at the edge.
package paywatch
