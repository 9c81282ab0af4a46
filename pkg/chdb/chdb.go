package chdb

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"regexp"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Config is how services reach ClickHouse; services nest it with envPrefix "CLICKHOUSE_".
type Config struct {
	Addr        string        `env:"ADDR" envDefault:"127.0.0.1:9000"`
	DB          string        `env:"DB" envDefault:"tokenscope"`
	User        string        `env:"USER" envDefault:"default"`
	Password    string        `env:"PASSWORD"`
	TLS         bool          `env:"TLS" envDefault:"false"`
	DialTimeout time.Duration `env:"DIAL_TIMEOUT" envDefault:"5s"`
	// HTTPAddr is the HTTP interface, which the aggregator writes raw requests through;
	// empty means ADDR's host on port 8123 (8443 with TLS).
	HTTPAddr string `env:"HTTP_ADDR"`
}

// HTTPURL returns the base URL of the server's HTTP interface.
func (c Config) HTTPURL() string {
	scheme, port := "http", "8123"
	if c.TLS {
		scheme, port = "https", "8443"
	}
	if c.HTTPAddr != "" {
		return scheme + "://" + c.HTTPAddr
	}
	host, _, err := net.SplitHostPort(c.Addr)
	if err != nil {
		host = c.Addr
	}
	return scheme + "://" + net.JoinHostPort(host, port)
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// Validate names the first bad variable.
func (c Config) Validate() error {
	switch {
	case c.Addr == "":
		return errors.New("CLICKHOUSE_ADDR is empty")
	case !identRE.MatchString(c.DB):
		return fmt.Errorf("CLICKHOUSE_DB=%q is not a valid database name (letters, digits and _)", c.DB)
	case c.DialTimeout <= 0:
		return fmt.Errorf("CLICKHOUSE_DIAL_TIMEOUT=%s must be positive", c.DialTimeout)
	case c.HTTPAddr != "":
		if _, port, err := net.SplitHostPort(c.HTTPAddr); err != nil || port == "" {
			return fmt.Errorf("CLICKHOUSE_HTTP_ADDR=%q is not host:port", c.HTTPAddr)
		}
	}
	return nil
}

// DB is a connection to tokenscope's ClickHouse database.
type DB struct {
	conn      driver.Conn
	name      string
	version   Version
	closeOnce sync.Once
	closeErr  error
}

// Open connects, creates the database when it is missing, and learns the server version.
func Open(ctx context.Context, cfg Config) (*DB, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts := &clickhouse.Options{
		Addr:        []string{cfg.Addr},
		Auth:        clickhouse.Auth{Database: "default", Username: cfg.User, Password: cfg.Password},
		DialTimeout: cfg.DialTimeout,
		// Rollup batches are small and frequent; compression pays for requests batches.
		Compression: &clickhouse.Compression{Method: clickhouse.CompressionLZ4},
	}
	if cfg.TLS {
		opts.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	boot, err := clickhouse.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to ClickHouse at %s: %w", cfg.Addr, err)
	}
	defer boot.Close()
	if err := boot.Ping(ctx); err != nil {
		return nil, fmt.Errorf("cannot reach ClickHouse at %s: %w", cfg.Addr, err)
	}
	if err := boot.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+cfg.DB); err != nil {
		return nil, fmt.Errorf("cannot create database %s: %w", cfg.DB, err)
	}
	opts.Auth.Database = cfg.DB
	conn, err := clickhouse.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to ClickHouse database %s: %w", cfg.DB, err)
	}
	var v string
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&v); err != nil {
		conn.Close()
		return nil, fmt.Errorf("cannot read the ClickHouse version: %w", err)
	}
	ver, err := ParseVersion(v)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &DB{conn: conn, name: cfg.DB, version: ver}, nil
}

// Conn returns the underlying connection (pooled, safe for concurrent use).
func (d *DB) Conn() driver.Conn { return d.conn }

// Name returns the database name.
func (d *DB) Name() string { return d.name }

// Version returns the server's version.
func (d *DB) Version() Version { return d.version }

// Ping checks the server answers, for readiness probes.
func (d *DB) Ping(ctx context.Context) error { return d.conn.Ping(ctx) }

// Close closes the connection; calling it again returns the first result.
func (d *DB) Close() error {
	d.closeOnce.Do(func() { d.closeErr = d.conn.Close() })
	return d.closeErr
}
