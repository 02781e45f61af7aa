package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Redis is a redis-server a test started on 127.0.0.1, without
// persistence, stopped when the test ends.
type Redis struct {
	tb   testing.TB
	Addr string
	args []string
	cmd  *exec.Cmd
	auth []string // AUTH's arguments before each command, when set
}

// Auth has Do authenticate as user with password before each command.
func (r *Redis) Auth(user, password string) { r.auth = []string{"AUTH", user, password} }

// StartRedis starts redis-server (the Debian package, which .ci/run
// installs), or the server $COMPACTCACHE_REDIS_SERVER names (valkey-server,
// say), on a free port with args added to its command line, and waits
// until it answers.
func StartRedis(tb testing.TB, args ...string) *Redis {
	tb.Helper()
	if _, err := exec.LookPath(RedisServer()); err != nil {
		tb.Fatalf("%s is not installed: apt-get install redis-server (.ci/run installs it)", RedisServer())
	}
	r := &Redis{tb: tb, Addr: "127.0.0.1:" + strconv.Itoa(FreePort(tb)), args: args}
	r.Start()
	tb.Cleanup(r.Kill)
	return r
}

// Start starts the server on its address again, empty.
func (r *Redis) Start() {
	r.tb.Helper()
	_, port, _ := net.SplitHostPort(r.Addr)
	dir := r.tb.TempDir()
	args := append([]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log")}, r.args...)
	r.cmd = exec.Command(RedisServer(), args...)
	if err := r.cmd.Start(); err != nil {
		r.tb.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		// An error reply (NOAUTH, where the default user is off) says the
		// server answers too.
		if _, err := r.Do("PING"); err == nil || errors.As(err, new(ReplyError)) {
			return
		} else if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			r.tb.Fatalf("redis-server on %s did not answer: %v\n%s", r.Addr, err, log)
		}
	}
}

// Kill kills the server and waits for it to exit.
func (r *Redis) Kill() {
	if r.cmd != nil && r.cmd.Process != nil {
		r.Resume() // a stopped server dies only once it runs
		r.cmd.Process.Kill()
		r.cmd.Wait()
		r.cmd = nil
	}
}

// Do sends a command on a connection of its own and
// returns the reply: a bulk string's bytes, an array's bulk strings a line
// each, else its first line; or an error for an error reply.
// The tests use it to set the server up and to look at what it holds.
func (r *Redis) Do(args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", r.Addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	if r.auth != nil {
		if err := send(c, r.auth); err != nil {
			return "", err
		}
		if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
			return "", fmt.Errorf("AUTH: %q %v", line, err)
		}
	}
	if err := send(c, args); err != nil {
		return "", err
	}
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case strings.HasPrefix(line, "-"):
		return "", ReplyError(line[1:])
	case strings.HasPrefix(line, "$") && line != "$-1":
		return readBulk(br, line)
	case strings.HasPrefix(line, "*") && line != "*-1":
		// An array of bulk strings (KEYS), a line each.
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", err
		}
		items := make([]string, n)
		for i := range items {
			h, err := br.ReadString('\n')
			if err != nil {
				return "", err
			}
			if items[i], err = readBulk(br, strings.TrimRight(h, "\r\n")); err != nil {
				return "", err
			}
		}
		return strings.Join(items, "\n"), nil
	}
	return line, nil
}

// readBulk reads the body of a bulk string whose header is header.
func readBulk(br *bufio.Reader, header string) (string, error) {
	n, err := strconv.Atoi(strings.TrimPrefix(header, "$"))
	if err != nil || !strings.HasPrefix(header, "$") {
		return "", fmt.Errorf("not a bulk string: %q", header)
	}
	body := make([]byte, n+2)
	if _, err := io.ReadFull(br, body); err != nil {
		return "", err
	}
	return string(body[:n]), nil
}

// ReplyError is an error the server replied with.
type ReplyError string

func (e ReplyError) Error() string { return string(e) }

// MustDo is Do that fails the test on an error.
func (r *Redis) MustDo(args ...string) string {
	r.tb.Helper()
	v, err := r.Do(args...)
	if err != nil {
		r.tb.Fatalf("redis %v: %v", args, err)
	}
	return v
}

// send writes a command as an array of bulk strings.
func send(w io.Writer, args []string) error {
	req := fmt.Sprintf("*%d\r\n", len(args))
	for _, a := range args {
		req += fmt.Sprintf("$%d\r\n%s\r\n", len(a), a)
	}
	_, err := io.WriteString(w, req)
	return err
}

// RedisServer is the server the tests start.
func RedisServer() string {
	if s := os.Getenv("COMPACTCACHE_REDIS_SERVER"); s != "" {
		return s
	}
	return "redis-server"
}
