package paywatch

import (
	"errors"
	"fmt"
)

// Code is a machine-readable error code, as documented in the HTTP API.
type Code string

// The error codes of the API contract.
const (
	CodeInvalidRequest  Code = "invalid_request"
	CodeInvalidAmount   Code = "invalid_amount"
	CodeUnknownNetwork  Code = "unknown_network"
	CodeUnknownAsset    Code = "unknown_asset"
	CodeNotFound        Code = "not_found"
	CodeConflict        Code = "conflict"
	CodeUnauthorized    Code = "unauthorized"
	CodeForbidden       Code = "forbidden"
	CodeNoUniqueAmount  Code = "no_unique_amount"
	CodeInvalidState    Code = "invalid_state"
	CodePayloadTooLarge Code = "payload_too_large"
	CodeRateLimited     Code = "rate_limited"
	CodeInternal        Code = "internal"
)

// Error is a domain error that carries an API code and a message meant for
// the caller. Anything that is not an *Error is reported as internal.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Errorf returns an *Error with the given code and formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the first *Error in err's chain, or
// CodeInternal when there is none.
func ErrorCode(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// ErrorMessage returns the caller-facing message of err. Internal errors get
// a generic message so that no detail of the database or a node leaks out.
func ErrorMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "internal error"
}
