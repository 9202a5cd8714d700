package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const (
	// readmeClaimsFile maps each behavioural claim of README.md to the tests
	// that would fail if paywatch stopped doing what it says.
	readmeClaimsFile = "testdata/readme_claims.md"
	// repositoryRoot is where README.md is and where the map's paths start,
	// seen from this package's directory (where go test runs it).
	repositoryRoot = "../.."
	// benchScript runs the benchmarks beside their baselines; a figure it
	// alone measures is named as ".ci/bench: what it runs".
	benchScript = ".ci/bench"
	// minReadmeClaims keeps the map from being emptied to make it pass.
	minReadmeClaims = 300
)

// TestReadmeClaimsMap checks testdata/readme_claims.md: every row quotes
// README.md (compared with runs of whitespace collapsed to one space) and
// names at least one test, each found as `func Name(` in the file named
// for it (or, for a figure only the benchmark script measures, what the
// script runs); a row still saying TODO or GAP fails. Every bad row is reported,
// with its line in the map.
func TestReadmeClaimsMap(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(repositoryRoot, "README.md"))
	if err != nil {
		t.Fatalf("read README.md: %v", err)
	}
	readmeText := collapseSpaces(string(readme))
	claims, err := os.ReadFile(readmeClaimsFile)
	if err != nil {
		t.Fatalf("read the README claims map: %v", err)
	}

	testName := regexp.MustCompile(`^((?:Test|Benchmark|Fuzz)[A-Za-z0-9_]*)(/\S+)?$`)
	unfinished := regexp.MustCompile(`\b(TODO|GAP)\b`)
	sources := map[string]string{} // test file path → its text, read once
	sourceErrs := map[string]error{}
	readSource := func(path string) (string, error) {
		if err, ok := sourceErrs[path]; ok {
			return "", err
		}
		if text, ok := sources[path]; ok {
			return text, nil
		}
		b, err := os.ReadFile(filepath.Join(repositoryRoot, filepath.FromSlash(path)))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				err = errors.New("no such file")
			}
			sourceErrs[path] = err
			return "", err
		}
		sources[path] = string(b)
		return sources[path], nil
	}

	rows := 0
	var problems []string
	for n, line := range strings.Split(string(claims), "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			continue
		}
		if len(line) < 2 || !strings.HasSuffix(line, "|") {
			problems = append(problems, fmt.Sprintf("line %d: a table row must end with |: %s", n+1, line))
			continue
		}
		cells := strings.Split(line[1:len(line)-1], "|")
		if len(cells) != 2 {
			problems = append(problems, fmt.Sprintf("line %d: %d cells, want two (README says, tests): %s", n+1, len(cells), line))
			continue
		}
		fragment := collapseSpaces(cells[0])
		tests := strings.TrimSpace(cells[1])
		separator := fragment != "" && strings.Trim(fragment, "-: ") == "" && strings.Trim(tests, "-: ") == ""
		if fragment == "README says" || separator {
			continue // a table's header or separator
		}
		rows++

		var bad []string
		if fragment == "" {
			bad = append(bad, "no README fragment")
		} else if !strings.Contains(readmeText, fragment) {
			bad = append(bad, "not in README.md")
		}
		switch {
		case tests == "":
			bad = append(bad, "names no test")
		case unfinished.MatchString(tests):
			bad = append(bad, "says "+unfinished.FindString(tests)+" instead of naming its tests")
		default:
			for _, item := range strings.Split(tests, "; ") {
				path, name, ok := strings.Cut(strings.TrimSpace(item), ": ")
				m := testName.FindStringSubmatch(name)
				switch {
				case ok && path == benchScript:
					// A figure measured by the benchmark script: the
					// script must still run what it names.
					if src, err := readSource(path); err != nil {
						bad = append(bad, fmt.Sprintf("%s: %v", path, err))
					} else if !strings.Contains(src, name) {
						bad = append(bad, fmt.Sprintf("%s does not run %q", path, name))
					}
				case !ok || m == nil:
					bad = append(bad, fmt.Sprintf("%q is not \"path/to/file_test.go: TestName\"", item))
				case !strings.HasSuffix(path, "_test.go") || !filepath.IsLocal(filepath.FromSlash(path)):
					bad = append(bad, fmt.Sprintf("%s: not a test file's path from the repository root", path))
				default:
					src, err := readSource(path)
					if err != nil {
						bad = append(bad, fmt.Sprintf("%s: %v", path, err))
					} else if !strings.Contains(src, "\nfunc "+m[1]+"(") {
						bad = append(bad, fmt.Sprintf("%s has no func %s(", path, m[1]))
					}
				}
			}
		}
		if len(bad) > 0 {
			problems = append(problems, fmt.Sprintf("line %d %q: %s", n+1, fragment, strings.Join(bad, "; ")))
		}
	}
	if rows < minReadmeClaims {
		problems = append(problems, fmt.Sprintf("%d rows, want at least %d: README claims were dropped from the map", rows, minReadmeClaims))
	}
	if len(problems) > 0 {
		t.Errorf("%s (%d rows), %d to fix:\n%s", readmeClaimsFile, rows, len(problems), strings.Join(problems, "\n"))
	}
}

// collapseSpaces turns every run of whitespace into one space and trims the
// ends, so that a fragment matches README.md whatever its line breaks.
func collapseSpaces(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
