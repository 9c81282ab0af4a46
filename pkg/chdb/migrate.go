package chdb

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
	"text/template"
	"time"
)

const ledgerDDL = `CREATE TABLE IF NOT EXISTS schema_migrations
(
    name       String,
    checksum   String,
    applied_at DateTime
)
ENGINE = MergeTree
ORDER BY name`

// Migrate applies, in name order, every *.sql file at the root of fsys that the
// schema_migrations table does not list yet, and returns the names it applied. Each file is
// a text/template (see Render) of statements separated by ";" at the end of a line; every
// statement must be idempotent (IF NOT EXISTS), so two services migrating at once are safe.
func (d *DB) Migrate(ctx context.Context, fsys fs.FS) ([]string, error) {
	if err := d.conn.Exec(ctx, ledgerDDL); err != nil {
		return nil, fmt.Errorf("cannot create schema_migrations: %w", err)
	}
	done, err := d.applied(ctx)
	if err != nil {
		return nil, err
	}
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("cannot list migrations: %w", err)
	}
	slices.Sort(names)
	features := FeaturesOf(d.version)
	var applied []string
	for _, name := range names {
		if done[name] {
			continue
		}
		raw, err := fs.ReadFile(fsys, name)
		if err != nil {
			return applied, fmt.Errorf("cannot read migration %s: %w", name, err)
		}
		sql, err := Render(name, string(raw), features)
		if err != nil {
			return applied, err
		}
		for i, stmt := range Statements(sql) {
			if err := d.conn.Exec(ctx, stmt); err != nil {
				return applied, fmt.Errorf("cannot apply migration %s (statement %d) on ClickHouse %s: %w", name, i+1, d.version, err)
			}
		}
		sum := sha256.Sum256(raw)
		if err := d.record(ctx, name, hex.EncodeToString(sum[:])); err != nil {
			return applied, fmt.Errorf("cannot record migration %s: %w", name, err)
		}
		applied = append(applied, name)
	}
	return applied, nil
}

// record notes an applied migration. It uses a batch, not INSERT … VALUES with bound
// arguments, which 18.16 never answers over the native protocol.
func (d *DB) record(ctx context.Context, name, checksum string) error {
	b, err := d.conn.PrepareBatch(ctx, "INSERT INTO schema_migrations (name, checksum, applied_at)")
	if err != nil {
		return err
	}
	if err := b.Append(name, checksum, time.Now().UTC()); err != nil {
		return err
	}
	return b.Send()
}

func (d *DB) applied(ctx context.Context) (map[string]bool, error) {
	rows, err := d.conn.Query(ctx, "SELECT DISTINCT name FROM schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("cannot read schema_migrations: %w", err)
	}
	defer rows.Close()
	done := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, fmt.Errorf("cannot read schema_migrations: %w", err)
		}
		done[name] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read schema_migrations: %w", err)
	}
	return done, nil
}

// Render fills in a migration's template for a server with the given features:
//
//	{{lc "String"}}   LowCardinality(String), or String
//	{{dt64 3}}        DateTime64(3, 'UTC'), or DateTime
//	{{ttl "ts" 30}}   TTL toDateTime(ts) + INTERVAL 30 DAY, or nothing
func Render(name, text string, f Features) (string, error) {
	funcs := template.FuncMap{
		"lc": func(t string) string {
			if f.LowCardinality {
				return "LowCardinality(" + t + ")"
			}
			return t
		},
		"dt64": func(precision int) string {
			if f.DateTime64 {
				return fmt.Sprintf("DateTime64(%d, 'UTC')", precision)
			}
			return "DateTime"
		},
		"ttl": func(col string, days int) string {
			if f.TTL {
				return fmt.Sprintf("TTL toDateTime(%s) + INTERVAL %d DAY", col, days)
			}
			return ""
		},
	}
	tmpl, err := template.New(path.Base(name)).Funcs(funcs).Option("missingkey=error").Parse(text)
	if err != nil {
		return "", fmt.Errorf("cannot parse migration %s: %w", name, err)
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, nil); err != nil {
		return "", fmt.Errorf("cannot render migration %s: %w", name, err)
	}
	return b.String(), nil
}

// Statements splits rendered SQL into statements at ";" that ends a line, dropping
// comment-only lines and empty statements.
func Statements(sql string) []string {
	var out []string
	var cur strings.Builder
	flush := func() {
		if s := strings.TrimSpace(cur.String()); s != "" {
			out = append(out, s)
		}
		cur.Reset()
	}
	for _, line := range strings.Split(sql, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") {
			continue
		}
		if strings.HasSuffix(trimmed, ";") {
			cur.WriteString(strings.TrimSuffix(trimmed, ";"))
			flush()
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
	}
	flush()
	return out
}
