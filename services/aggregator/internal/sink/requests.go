package sink

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
)

// Raw request events are the aggregator's largest write by far: one row of 34 columns per
// event. They go through ClickHouse's HTTP interface as RowBinary, encoded straight from
// the decoded event into one reused buffer: no column copies, no per-batch allocations,
// and nothing that points into message payloads. Through the native driver the same rows
// cost ~2 µs each on the client (its columns are rebuilt for every batch); this way ~0.2 µs.

// requestColumns is the requests table's columns in the order Add encodes them, with the
// type each is encoded as; "String" also accepts LowCardinality(String), and ts is DateTime
// or DateTime64(3).
var requestColumns = []struct{ name, typ string }{
	{"ts", "DateTime"}, {"event_id", "String"}, {"env", "String"}, {"scene", "String"}, {"model", "String"},
	{"instance", "String"}, {"tenant", "String"}, {"provider", "String"}, {"layer", "String"}, {"trace_id", "String"}, {"bucket", "String"},
	{"input_tokens", "UInt32"}, {"output_tokens", "UInt32"}, {"cached_input_tokens", "UInt32"},
	{"tokens_estimated", "UInt8"}, {"ttft_ms", "Float64"}, {"total_ms", "Float64"}, {"tpot_ms", "Nullable(Float64)"},
	{"max_itl_ms", "Float64"}, {"queue_ms", "Float64"}, {"prefill_ms", "Float64"}, {"decode_ms", "Float64"},
	{"status", "String"}, {"error_code", "String"},
	{"http_status", "UInt16"}, {"stream", "UInt8"}, {"conversation_id", "String"}, {"turn", "UInt32"},
	{"outcome", "String"}, {"score_names", "Array(String)"}, {"score_values", "Array(Float64)"},
	{"cost_usd", "Float64"}, {"consumer", "String"}, {"stream_seq", "UInt64"},
}

// RequestWriter inserts buffered request events into the requests table.
type RequestWriter struct {
	client   *http.Client
	base     string // URL up to the query string
	query    url.Values
	user     string
	password string
	tsMillis bool   // ts is DateTime64(3): milliseconds, not seconds
	consumer []byte // the consumer column's encoded value
	blocks   *blockPool
}

// NewRequestWriter checks the requests table's columns against what the writer encodes
// (through conn) and returns a writer to the HTTP interface of cfg.
func NewRequestWriter(ctx context.Context, conn driver.Conn, cfg chdb.Config, consumer string) (*RequestWriter, error) {
	rows, err := conn.Query(ctx, "SELECT name, type FROM system.columns WHERE database = currentDatabase() AND table = 'requests'")
	if err != nil {
		return nil, fmt.Errorf("cannot read the columns of requests: %w", err)
	}
	defer rows.Close()
	got := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return nil, fmt.Errorf("cannot read the columns of requests: %w", err)
		}
		got[name] = typ
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read the columns of requests: %w", err)
	}
	w := &RequestWriter{user: cfg.User, password: cfg.Password, blocks: &blockPool{}}
	names := make([]string, len(requestColumns))
	for i, c := range requestColumns {
		name, want := c.name, c.typ
		names[i] = name
		typ, ok := got[name]
		switch {
		case !ok:
			return nil, fmt.Errorf("table requests has no column %s; run the migrations (schemas/clickhouse)", name)
		case typ == want, want == "String" && typ == "LowCardinality(String)",
			want == "Array(String)" && typ == "Array(LowCardinality(String))":
		case name == "ts" && strings.HasPrefix(typ, "DateTime64(3"):
			w.tsMillis = true
		default:
			return nil, fmt.Errorf("column requests.%s is %s; the aggregator writes it as %s", name, typ, want)
		}
	}
	limited, err := HasPartitionLimit(ctx, conn)
	if err != nil {
		return nil, err
	}
	w.consumer = appendString(nil, consumer)
	w.base = cfg.HTTPURL() + "/"
	w.query = url.Values{
		"database": {cfg.DB},
		"query":    {"INSERT INTO requests (" + strings.Join(names, ", ") + ") FORMAT RowBinary"},
	}
	// As for the rollups (insertCtx): a Distributed table stores before answering, and a
	// batch of events from more than 100 days (requests are partitioned by day) is stored,
	// not refused on every retry.
	for k, v := range InsertSettings(limited) {
		w.query.Set(k, fmt.Sprint(v))
	}
	tr := &http.Transport{
		Proxy:               nil, // ClickHouse is reached directly, whatever HTTP_PROXY says
		DialContext:         (&net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	if cfg.TLS {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	w.client = &http.Client{Transport: tr}
	if err := w.ping(ctx, cfg.DialTimeout); err != nil {
		return nil, err
	}
	return w, nil
}

// ping checks the HTTP interface answers, so that a wrong address fails the start with a
// clear error rather than every flush.
func (w *RequestWriter) ping(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.base+"ping", nil)
	if err != nil {
		return fmt.Errorf("cannot reach ClickHouse's HTTP interface (CLICKHOUSE_HTTP_ADDR): %w", err)
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach ClickHouse's HTTP interface at %s (CLICKHOUSE_HTTP_ADDR): %w", w.base, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
	if resp.StatusCode != http.StatusOK || !bytes.HasPrefix(body, []byte("Ok.")) {
		return fmt.Errorf("%s is not ClickHouse's HTTP interface (CLICKHOUSE_HTTP_ADDR): GET /ping answered %s %q", w.base, resp.Status, body)
	}
	return nil
}

// NewBuffer returns an empty buffer encoding rows for w.
func (w *RequestWriter) NewBuffer() *Requests {
	return &Requests{tsMillis: w.tsMillis, consumer: w.consumer, blocks: w.blocks}
}

// Write inserts the buffered events in one INSERT tagged queryID (see Settle). The rows are
// one block: all of them are stored or none.
func (w *RequestWriter) Write(ctx context.Context, r *Requests, queryID string) error {
	if r.Len() == 0 {
		return nil
	}
	q := make(url.Values, len(w.query)+1)
	for k, v := range w.query {
		q[k] = v
	}
	q.Set("query_id", queryID)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.base+"?"+q.Encode(), r.body())
	if err != nil {
		return fmt.Errorf("cannot insert into requests: %w", err)
	}
	req.ContentLength = int64(r.Bytes())
	req.SetBasicAuth(w.user, w.password)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := w.client.Do(req)
	if err != nil {
		return fmt.Errorf("cannot insert %d rows into requests: %w", r.Len(), err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("cannot insert %d rows into requests: ClickHouse answered %s: %s", r.Len(), resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// Requests buffers request events for the requests table as RowBinary rows, in the order of
// requestColumns, in blocks of blockSize bytes: growing never copies what is written (a
// 64k-event batch is ~14 MB), and the blocks go back to the writer's pool for the next
// batch, so that once warm adding an event neither allocates nor touches fresh memory.
type Requests struct {
	full     [][]byte // filled blocks
	cur      []byte   // the block being filled
	size     int      // bytes in full
	n        int
	lo, hi   uint64
	tsMillis bool
	consumer []byte
	blocks   *blockPool
}

// blockSize is the unit Requests grows by.
const blockSize = 1 << 20

// rowFixed bounds a row's bytes other than its strings' (numbers, length prefixes, NULL flag).
const rowFixed = 128 + 16*binary.MaxVarintLen64

// Add appends one event at stream position seq.
func (r *Requests) Add(ev *events.RequestEvent, bucket string, cost float64, seq uint64) {
	layer := ev.Layer.OrGateway()
	need := rowFixed + len(r.consumer) + len(ev.EventID) + len(ev.Env) + len(ev.Scene) + len(ev.Model) +
		len(ev.Instance) + len(ev.Tenant) + len(ev.Provider) + len(layer) + len(ev.TraceID) + len(bucket) + len(ev.Status) + len(ev.ErrorCode) +
		len(ev.ConversationID) + len(ev.Outcome)
	for _, sc := range ev.Scores {
		need += binary.MaxVarintLen64 + len(sc.Name) + 8
	}
	if cap(r.cur)-len(r.cur) < need {
		r.grow(need)
	}
	b := r.cur
	if r.tsMillis {
		b = binary.LittleEndian.AppendUint64(b, uint64(ev.TS.UnixMilli()))
	} else {
		b = binary.LittleEndian.AppendUint32(b, uint32(ev.TS.Unix()))
	}
	b = appendString(b, ev.EventID)
	b = appendString(b, ev.Env)
	b = appendString(b, ev.Scene)
	b = appendString(b, ev.Model)
	b = appendString(b, ev.Instance)
	b = appendString(b, ev.Tenant)
	b = appendString(b, ev.Provider)
	b = appendString(b, string(layer))
	b = appendString(b, ev.TraceID)
	b = appendString(b, bucket)
	b = binary.LittleEndian.AppendUint32(b, uint32(ev.InputTokens))
	b = binary.LittleEndian.AppendUint32(b, uint32(ev.OutputTokens))
	b = binary.LittleEndian.AppendUint32(b, uint32(ev.CachedInputTokens))
	b = append(b, b2u8(ev.TokensEstimated))
	b = appendFloat(b, ev.TTFTMs)
	b = appendFloat(b, ev.TotalMs)
	if tpot, ok := ev.TPOT(); ok {
		b = appendFloat(append(b, 0), tpot)
	} else {
		b = append(b, 1) // NULL
	}
	b = appendFloat(b, ev.MaxITLMs)
	b = appendFloat(b, ev.QueueMs)
	b = appendFloat(b, ev.PrefillMs)
	b = appendFloat(b, ev.DecodeMs)
	b = appendString(b, string(ev.Status))
	b = appendString(b, ev.ErrorCode)
	b = binary.LittleEndian.AppendUint16(b, uint16(ev.HTTPStatus))
	b = append(b, b2u8(ev.Stream))
	b = appendString(b, ev.ConversationID)
	b = binary.LittleEndian.AppendUint32(b, uint32(ev.Turn))
	b = appendString(b, string(ev.Outcome))
	b = binary.AppendUvarint(b, uint64(len(ev.Scores)))
	for _, sc := range ev.Scores {
		b = appendString(b, sc.Name)
	}
	b = binary.AppendUvarint(b, uint64(len(ev.Scores)))
	for _, sc := range ev.Scores {
		b = appendFloat(b, sc.Value)
	}
	b = appendFloat(b, cost)
	b = append(b, r.consumer...)
	b = binary.LittleEndian.AppendUint64(b, seq)
	r.cur = b
	if r.n == 0 {
		r.lo = seq
	}
	r.hi = seq
	r.n++
}

// grow starts a new block with room for at least need bytes.
func (r *Requests) grow(need int) {
	if len(r.cur) > 0 {
		r.full = append(r.full, r.cur)
		r.size += len(r.cur)
	} else if r.cur != nil {
		r.blocks.put(r.cur)
	}
	r.cur = r.blocks.get(need)
}

// Len returns the number of buffered events.
func (r *Requests) Len() int { return r.n }

// Bytes returns the size of the encoded rows.
func (r *Requests) Bytes() int { return r.size + len(r.cur) }

// SeqRange returns the first and last stream positions buffered.
func (r *Requests) SeqRange() (lo, hi uint64) { return r.lo, r.hi }

// body reads the encoded rows.
func (r *Requests) body() io.Reader {
	rs := make([]io.Reader, 0, len(r.full)+1)
	for _, b := range r.full {
		rs = append(rs, bytes.NewReader(b))
	}
	return io.MultiReader(append(rs, bytes.NewReader(r.cur))...)
}

// Drop removes the rows whose stream positions are in stored (ascending), in place, and
// returns how many it removed: what is left is what an earlier, partly stored attempt did
// not store. Rows never span blocks, so each block is compacted on its own.
func (r *Requests) Drop(stored []uint64) int {
	if len(stored) == 0 || r.n == 0 {
		return 0
	}
	dropped := 0
	r.n, r.lo, r.hi, r.size = 0, 0, 0, 0
	compact := func(b []byte) []byte {
		w := 0
		for i := 0; i < len(b); {
			n := r.rowLen(b[i:])
			seq := binary.LittleEndian.Uint64(b[i+n-8 : i+n]) // stream_seq is the last column
			if _, found := slices.BinarySearch(stored, seq); found {
				dropped++
			} else {
				w += copy(b[w:], b[i:i+n])
				if r.n == 0 {
					r.lo = seq
				}
				r.hi = seq
				r.n++
			}
			i += n
		}
		return b[:w]
	}
	for i, b := range r.full {
		r.full[i] = compact(b)
		r.size += len(r.full[i])
	}
	r.cur = compact(r.cur)
	return dropped
}

// rowLen returns the length of the row b starts with, as Add encoded it (the types of
// requestColumns).
func (r *Requests) rowLen(b []byte) int {
	i := 0
	for _, c := range requestColumns {
		switch c.typ {
		case "DateTime":
			if r.tsMillis {
				i += 8
			} else {
				i += 4
			}
		case "String":
			n, k := binary.Uvarint(b[i:])
			i += k + int(n)
		case "UInt8":
			i++
		case "UInt16":
			i += 2
		case "UInt32":
			i += 4
		case "UInt64", "Float64":
			i += 8
		case "Array(String)":
			n, k := binary.Uvarint(b[i:])
			i += k
			for range n {
				m, k := binary.Uvarint(b[i:])
				i += k + int(m)
			}
		case "Array(Float64)":
			n, k := binary.Uvarint(b[i:])
			i += k + 8*int(n)
		case "Nullable(Float64)":
			if b[i] == 0 {
				i += 8
			}
			i++
		}
	}
	return i
}

// Reset empties the buffer; its blocks go back to the pool.
func (r *Requests) Reset() {
	for _, b := range r.full {
		r.blocks.put(b)
	}
	clear(r.full)
	r.full, r.cur = r.full[:0], r.cur[:0]
	r.size, r.n, r.lo, r.hi = 0, 0, 0, 0
}

// blockPool keeps the blocks of a writer's buffers for reuse. Unlike a sync.Pool it keeps
// them across garbage collections: memory the buffers have used stays theirs.
type blockPool struct {
	mu   sync.Mutex
	free [][]byte
}

func (p *blockPool) get(need int) []byte {
	if p == nil || need > blockSize {
		return make([]byte, 0, max(need, blockSize))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.free); n > 0 {
		b := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		return b[:0]
	}
	return make([]byte, 0, blockSize)
}

func (p *blockPool) put(b []byte) {
	if p == nil || cap(b) != blockSize {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) < maxFreeBlocks {
		p.free = append(p.free, b[:0])
	}
}

// maxFreeBlocks bounds the pool: two full batches (the one being written and the next).
const maxFreeBlocks = 40

func appendString(b []byte, s string) []byte {
	if len(s) < 0x80 {
		b = append(b, byte(len(s)))
	} else {
		b = binary.AppendUvarint(b, uint64(len(s)))
	}
	return append(b, s...)
}

func appendFloat(b []byte, f float64) []byte {
	return binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
}

func b2u8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
