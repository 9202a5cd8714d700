//go:build nodev

package main

import (
	"context"
	"errors"
)

// devCommand is left out of builds tagged nodev: they carry no development
// chain.
func devCommand(context.Context, *env, []string) error {
	return usageError{errors.New("this paywatch was built without the development mode (build tag nodev)")}
}
