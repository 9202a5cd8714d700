package api

import (
	_ "embed"
	"encoding/json"
	"net/http"

	"go.yaml.in/yaml/v3"
)

// openAPIYAML is the OpenAPI 3 description of this API; tests validate
// every response of the server against it.
//
//go:embed openapi.yaml
var openAPIYAML []byte

// OpenAPI returns the API's OpenAPI document as JSON.
func OpenAPI() ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(openAPIYAML, &doc); err != nil {
		return nil, err
	}
	return json.Marshal(doc)
}

func (s *Server) openAPI(w http.ResponseWriter, _ *http.Request) {
	doc, err := OpenAPI()
	if err != nil {
		s.log.Error("the embedded OpenAPI document does not parse", "err", err)
		writeError(w, err, 0)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	_, _ = w.Write(doc)
}
