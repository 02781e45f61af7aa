package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ModuleRoot returns the directory of the plugin's module, the repository's
// root: through go.work or bench's replace directive, whichever the go
// command uses.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/compactcache/compactcache").Output()
	if err != nil {
		return "", fmt.Errorf("go list -m github.com/compactcache/compactcache: %v (run from inside the repository)", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// SourceTree returns the directory to build cmd/coredns in and a description
// of it: the work tree at root with its commit and uncommitted changes
// (rev empty), or rev exported with git archive into dir/src.
func SourceTree(ctx context.Context, root, rev, dir string) (string, string, error) {
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = root
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	}
	if rev == "" {
		head, err := git("rev-parse", "--short", "HEAD")
		if err != nil {
			return root, "the work tree (not a git checkout)", nil
		}
		status, _ := git("status", "--porcelain", "--untracked-files=no")
		if status == "" {
			return root, "the work tree at " + head + ", clean", nil
		}
		return root, fmt.Sprintf("the work tree at %s with %d files changed", head, len(strings.Split(status, "\n"))), nil
	}
	sha, err := git("rev-parse", "--short", rev+"^{commit}")
	if err != nil {
		return "", "", fmt.Errorf("-rev %s: not a commit", rev)
	}
	src := filepath.Join(dir, "src")
	if err := os.RemoveAll(src); err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", "", err
	}
	archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, sha, src)
	if out, err := archive.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("git archive %s: %v: %s", sha, err, out)
	}
	return src, "commit " + sha + " (git archive)", nil
}

// BuildCoreDNS builds the tree src's cmd/coredns (src empty: the work
// tree's, ModuleRoot) into bin, its output on stderr: in its own module
// where it has one, from the tree's root in commits before it had. Without
// a go.work, which a tree exported under the repository would pick up from
// above and not be part of.
func BuildCoreDNS(ctx context.Context, src, bin string) error {
	if src == "" {
		root, err := ModuleRoot()
		if err != nil {
			return err
		}
		src = root
	}
	dir, pkg := src, "./cmd/coredns"
	if _, err := os.Stat(filepath.Join(src, "cmd", "coredns", "go.mod")); err == nil {
		dir, pkg = filepath.Join(src, "cmd", "coredns"), "."
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build -o %s %s (in %s): %v", bin, pkg, dir, err)
	}
	return nil
}
