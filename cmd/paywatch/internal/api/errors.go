package api

import (
	"encoding/json"
	"net/http"

	"github.com/paywatch/paywatch"
)

// statusOf is the one table that maps error codes to HTTP statuses.
var statusOf = map[paywatch.Code]int{
	paywatch.CodeInvalidRequest:  http.StatusBadRequest,
	paywatch.CodeInvalidAmount:   http.StatusBadRequest,
	paywatch.CodeUnknownNetwork:  http.StatusBadRequest,
	paywatch.CodeUnknownAsset:    http.StatusBadRequest,
	paywatch.CodeNotFound:        http.StatusNotFound,
	paywatch.CodeConflict:        http.StatusConflict,
	paywatch.CodeUnauthorized:    http.StatusUnauthorized,
	paywatch.CodeForbidden:       http.StatusForbidden,
	paywatch.CodeNoUniqueAmount:  http.StatusConflict,
	paywatch.CodeInvalidState:    http.StatusConflict,
	paywatch.CodePayloadTooLarge: http.StatusRequestEntityTooLarge,
	paywatch.CodeRateLimited:     http.StatusTooManyRequests,
	paywatch.CodeInternal:        http.StatusInternalServerError,
}

type errorBody struct {
	Error struct {
		Code    paywatch.Code `json:"code"`
		Message string        `json:"message"`
	} `json:"error"`
}

// writeError writes err in the API's error format. status overrides the
// code's usual status when non-zero.
func writeError(w http.ResponseWriter, err error, status int) {
	var body errorBody
	body.Error.Code = paywatch.ErrorCode(err)
	body.Error.Message = paywatch.ErrorMessage(err)
	if status == 0 {
		status = statusOf[body.Error.Code]
	}
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}
