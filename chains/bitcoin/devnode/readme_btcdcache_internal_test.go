package devnode

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// btcdCacheEnv points the user's cache directory at a new temporary one and
// takes every btcd off PATH (the Go toolchain stays on it). It returns the
// cache directory and the btcd version paywatch builds.
func btcdCacheEnv(t *testing.T) (cache, version string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/btcsuite/btcd").Output()
	if err != nil {
		t.Fatalf("go list -m github.com/btcsuite/btcd: %v", err)
	}
	var path []string
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if _, err := os.Stat(filepath.Join(dir, "btcd")); err != nil {
			path = append(path, dir)
		}
	}
	cache = t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	t.Setenv("PATH", strings.Join(path, string(os.PathListSeparator)))
	return cache, strings.TrimSpace(string(out))
}

// btcdCachePlant puts a stand-in for an already built btcd into dir, made
// with the given permissions, and returns its path and content.
func btcdCachePlant(t *testing.T, dir string, perm os.FileMode, version string) (string, string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, perm); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "btcd-"+version)
	content := "#!/bin/sh\n# the btcd built the first time\n"
	if err := os.WriteFile(bin, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, content
}

// README: "btcd is built with the Go toolchain the first time (about a
// minute) into `paywatch/bin` of the user's cache directory". A btcd of
// the right version already in paywatch/bin of the cache directory is the
// one run the next times: it is neither built again nor replaced.
func TestBtcdInTheUserCacheIsReusedNotRebuilt(t *testing.T) {
	cache, version := btcdCacheEnv(t)
	bin, content := btcdCachePlant(t, filepath.Join(cache, "paywatch", "bin"), 0o700, version)
	before, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	got, err := btcdPath()
	if err != nil || got != bin {
		t.Fatalf("with %s already built, paywatch runs %q (%v), want that one", bin, got, err)
	}
	after, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	if raw, err := os.ReadFile(bin); err != nil || string(raw) != content || !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("the btcd already in the cache was built again (modified %s, was %s): %v", after.ModTime(), before.ModTime(), err)
	}
}

// README: "btcd is built ... into `paywatch/bin` of the user's cache
// directory ... unless one is on `PATH`". A btcd on PATH is the one run:
// nothing is built, not even the cache directory is made.
func TestBtcdOnPathIsRunInsteadOfBuilding(t *testing.T) {
	cache, _ := btcdCacheEnv(t)
	onPath := t.TempDir()
	own := filepath.Join(onPath, "btcd")
	if err := os.WriteFile(own, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", onPath+string(os.PathListSeparator)+os.Getenv("PATH"))
	got, err := btcdPath()
	if err != nil || got != own {
		t.Fatalf("with a btcd on PATH, paywatch runs %q (%v), want %s", got, err, own)
	}
	if _, err := os.Stat(filepath.Join(cache, "paywatch")); !os.IsNotExist(err) {
		t.Fatalf("with a btcd on PATH, paywatch made %s (%v)", filepath.Join(cache, "paywatch"), err)
	}
}

// The cache directory btcd is run from is one only the user can write:
// where others could swap the binary (a group- or world-writable
// paywatch/bin), paywatch refuses it and runs nothing from it.
func TestBtcdCacheOthersCanWriteToIsRefused(t *testing.T) {
	cache, version := btcdCacheEnv(t)
	dir := filepath.Join(cache, "paywatch", "bin")
	btcdCachePlant(t, dir, 0o777, version)
	got, err := btcdPath()
	if err == nil || !strings.Contains(err.Error(), dir+" must be a directory only you can write to") {
		t.Fatalf("with %s writable by all, paywatch runs %q (%v), want it refused", dir, got, err)
	}
}
