package scrape

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/ops"
)

// publisher queues a message without blocking; bus.Publisher is one.
type publisher interface {
	Publish(subject, msgID string, data []byte) bool
}

// Options configure a Scraper.
type Options struct {
	Host      string
	Interval  time.Duration
	Timeout   time.Duration // per scrape; below Interval
	MaxBytes  int64         // largest exposition read; a larger one fails the scrape
	MaxModels int           // models per engine; more are left out and counted
	MaxSeries int           // series of the families read held per engine; 0 is DefaultMaxSeries
}

// Scraper scrapes every target once per tick, concurrently, and publishes one sample per
// engine × model (one up=false sample for an engine that could not be read).
type Scraper struct {
	targets  []*target
	pub      publisher
	opts     Options
	subject  string
	client   *http.Client
	m        *metrics
	logger   *slog.Logger
	lastTick atomic.Int64
}

// target is one endpoint and what its previous scrape left, to subtract from the next.
type target struct {
	Target
	body    bytes.Buffer
	cache   *seriesCache
	models  map[string]*state
	series  map[string]*seriesState // by family and labels, as track keys them
	created map[string]*createdTime // creation times of series, keyed as series by their _created family
	gen     uint64                  // good scrapes read
	leftOut [numSlots]bool          // the families the last good scrape left series out of (Options.MaxSeries): a series of one new since may be one of them, its total not new
	read    time.Time               // the tick of the last good scrape read
	live    int                     // series the last scrape had
	key     []byte                  // track's key buffer
	counts  []float64               // a histogram series' delta, before it is added
	lastErr string
	docType string // of the last answer, where it names a document no exposition has (notExposition)
	out     []events.EngineSample
}

// state is one model's readings at one scrape: its gauges, and the deltas of its counters
// and histograms since its previous scrape (none at its first).
type state struct {
	ts       time.Time
	baseline bool                              // the model's first scrape: no deltas
	has      [numFields]bool                   // a gauge read, or a delta taken
	counters [numFields]float64                // a gauge's value, or a counter's delta
	hists    [numFields]*events.HistogramDelta // a histogram's delta
	le       [numFields][]float64              // the bounds every histogram series of a field has
	// while reading: which name set each field (0 none, 1 legacy, 2 current) and the
	// fields dropped for a conflict this scrape
	from     [numFields]uint8
	conflict [numFields]bool
}

// seriesState is the last value read of one counter or histogram series of a model read:
// a reading's delta is the sum of its series' deltas, each against its own last value.
type seriesState struct {
	gen     uint64    // the last scrape that had the series
	seen    time.Time // when
	ok      bool      // v or h is its last good value; false: exposed, never with a good one
	v       float64
	h       *cumHist
	created float64 // the creation time the engine gave it (Unix seconds), 0 if none
	stable  bool    // the same creation time at its last two scrapes
}

// remade records c, the series' creation time at this scrape (0: none), and reports
// whether it says the series was made anew since its last value: another creation time
// than the one it kept at least two scrapes. A creation time that moves from scrape to
// scrape (an exposition writing the clock there) is not one, and tells nothing.
func (sv *seriesState) remade(c float64) bool {
	if c == 0 {
		return false
	}
	changed := sv.created != 0 && c != sv.created
	trusted := sv.stable
	sv.stable = c == sv.created
	sv.created = c
	return changed && trusted
}

// unreset reports whether c, the creation time remade has just recorded, says the series
// was not reset since its last value: it has one, the same as at the scrape before. A
// counter that falls under it did not restart (a restart makes a new creation time).
func (sv *seriesState) unreset(c float64) bool { return c != 0 && sv.stable }

// createdTime is a series' creation time as a scrape exposed it.
type createdTime struct {
	gen uint64 // the scrape (target.gen) that exposed it
	v   float64
}

// seriesForget is how long the last value of a series gone from the exposition is kept:
// one back within it is a series the exposition missed, and its delta is against that
// value, never its whole total. Gone series are also forgotten, the oldest first, once
// they outnumber the series of the last scrape, so the state stays bounded whatever the
// horizon; a series back after it was forgotten is told apart by its creation time where
// the engine exposes one (see read).
const seriesForget = 24 * time.Hour

// cumHist is a histogram as exposed: finite upper bounds, cumulative counts at each, and
// the total count (the +Inf bucket) and sum.
type cumHist struct {
	le    []float64
	cum   []float64
	count float64
	sum   float64
}

// New returns a Scraper of targets that publishes through pub.
func New(targets []Target, pub publisher, opts Options, reg prometheus.Registerer, logger *slog.Logger) *Scraper {
	s := &Scraper{
		pub: pub, opts: opts,
		subject: events.EngineSampleSubject(opts.Host),
		m:       newMetrics(reg, targets),
		logger:  logger,
		client: &http.Client{
			Timeout:       opts.Timeout,
			CheckRedirect: sameHost,
			Transport: &http.Transport{
				Proxy:               nil, // engines are on this host; never through a proxy
				DialContext:         (&net.Dialer{Timeout: opts.Timeout}).DialContext,
				MaxIdleConnsPerHost: 2,
				IdleConnTimeout:     max(3*opts.Interval, 30*time.Second),
				DisableCompression:  false,
			},
		},
	}
	for _, t := range targets {
		s.targets = append(s.targets, &target{
			Target:  t,
			models:  map[string]*state{},
			series:  map[string]*seriesState{},
			created: map[string]*createdTime{},
			cache:   newSeriesCache(opts.MaxSeries),
		})
	}
	return s
}

// Run scrapes on wall-clock multiples of the interval, the ticks the GPU sampler takes,
// until ctx ends.
func (s *Scraper) Run(ctx context.Context) error {
	next := time.Now().Truncate(s.opts.Interval).Add(s.opts.Interval)
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		s.Tick(ctx, next)
		next = time.Now().Truncate(s.opts.Interval).Add(s.opts.Interval)
		timer.Reset(time.Until(next))
	}
}

// LastTick returns when the last tick finished, or the zero time before the first.
func (s *Scraper) LastTick() time.Time {
	if ns := s.lastTick.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Tick scrapes every target at now and queues the samples.
func (s *Scraper) Tick(ctx context.Context, now time.Time) {
	now = now.UTC().Truncate(time.Millisecond)
	var wg sync.WaitGroup
	for _, t := range s.targets {
		wg.Go(func() { s.scrapeTarget(ctx, t, now) })
	}
	wg.Wait()
	for _, t := range s.targets {
		for i := range t.out {
			s.publish(&t.out[i], now)
		}
	}
	s.lastTick.Store(time.Now().UnixNano())
}

func (s *Scraper) publish(smp *events.EngineSample, now time.Time) {
	// A reading the contract refuses is left out, not the sample with the rest.
	dropped, err := events.DropBadReadings(smp, now)
	if len(dropped) > 0 {
		s.m.dropped.WithLabelValues(smp.Name, "invalid_reading").Add(float64(len(dropped)))
	}
	if err != nil {
		s.m.invalid.WithLabelValues(events.Reason(err)).Inc()
		return
	}
	data, err := events.MarshalEngineSample(smp)
	if err != nil {
		s.m.invalid.WithLabelValues("other").Inc()
		return
	}
	if s.pub.Publish(s.subject, msgID(smp), data) {
		s.m.samples.Inc()
	}
}

// msgID is host/name/model/ts, the model hashed: one sample of one engine's model at
// one tick, whatever bytes the model name holds.
func msgID(s *events.EngineSample) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s.Model))
	b := make([]byte, 0, 96)
	b = append(b, s.Host...)
	b = append(b, '/')
	b = append(b, s.Name...)
	b = append(b, '/')
	b = strconv.AppendUint(b, h.Sum64(), 16)
	b = append(b, '/')
	return string(events.AppendTime(b, s.TS))
}

// scrapeTarget fills t.out with this tick's samples of t.
func (s *Scraper) scrapeTarget(ctx context.Context, t *target, now time.Time) {
	began := time.Now()
	t.out = t.out[:0]
	reason, err := s.fetch(ctx, t)
	if err != nil && ctx.Err() != nil {
		// gpuwatch is stopping: a scrape it cut short says nothing of the engine, and an
		// up=false sample would report every engine down at each restart.
		return
	}
	s.m.scrapes.WithLabelValues(t.Name).Inc()
	var fams map[string]*dto.MetricFamily
	if err == nil {
		fams, err = families(t.body.Bytes(), names[t.Engine], t.cache)
		if t.docType != "" && (err != nil || len(fams) == 0 && len(t.cache.created) == 0) {
			err = fmt.Errorf("engine answered a document of type %s, not an exposition", t.docType)
		}
		if err != nil {
			reason = "malformed"
		} else {
			if t.cache.dups > 0 {
				s.m.dropped.WithLabelValues(t.Name, "duplicate_series").Add(float64(t.cache.dups))
			}
			if t.cache.over > 0 {
				s.m.dropped.WithLabelValues(t.Name, "series_over_limit").Add(float64(t.cache.over))
			}
		}
	}
	// The buffer is kept for the next scrape at the size of what the engine sends, not of a
	// flood: what a failed scrape read is let go, and so is a buffer grown by an answer far
	// larger than this one.
	if c := t.body.Cap(); c > bodyKeep && (err != nil || c > 2*t.body.Len()+bodyKeep) {
		t.body = bytes.Buffer{}
	}
	if err != nil {
		s.m.failed.WithLabelValues(t.Name, reason).Inc()
		s.m.up.WithLabelValues(t.Name).Set(0)
		// Logged when the failure changes, not at every tick: the error's text also holds
		// what differs between two attempts of one failure (the local port of a connection
		// the engine reset, the line a malformed exposition broke at), so the reason is
		// what is compared, and the status of an engine that answers with another.
		key := reason
		if reason == "http_status" {
			key += ": " + err.Error()
		}
		if key != t.lastErr {
			s.logger.Warn("cannot scrape engine; reported down", "engine", t.Name, "url", ops.RedactURL(t.URL), "reason", reason, "err", err)
			t.lastErr = key
		}
		t.out = append(t.out, events.EngineSample{V: events.Version, TS: now, Host: s.opts.Host,
			Engine: t.Engine, Name: t.Name, Up: false, Error: reason})
		return
	}
	if t.lastErr != "" {
		s.logger.Info("engine scraped again", "engine", t.Name)
		t.lastErr = ""
	}
	s.m.up.WithLabelValues(t.Name).Set(1)
	cur := s.read(t, fams, now)
	s.m.models.WithLabelValues(t.Name).Set(float64(len(cur)))
	for mdl, st := range cur {
		st.ts = now
		smp := events.EngineSample{V: events.Version, TS: now, Host: s.opts.Host,
			Engine: t.Engine, Name: t.Name, Model: mdl, Up: true}
		s.fill(&smp, st, t.models[mdl])
		t.out = append(t.out, smp)
	}
	// Only what this scrape saw is kept: a model the engine unloaded leaves no state.
	t.models = cur
	slices.SortFunc(t.out, func(a, b events.EngineSample) int {
		switch {
		case a.Model < b.Model:
			return -1
		case a.Model > b.Model:
			return 1
		}
		return 0
	})
	s.m.duration.WithLabelValues(t.Name).Observe(time.Since(began).Seconds())
}

// bodyKeep is the size of body buffer kept whatever a scrape read: a vLLM exposition of
// one model (297 series) is some 40 KiB.
const bodyKeep = 64 << 10

// fetch reads t's exposition into t.body.
func (s *Scraper) fetch(ctx context.Context, t *target) (reason string, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
	if err != nil {
		return "connect", withoutURL(err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.client.Do(req)
	if err != nil {
		if errors.Is(err, errRedirect) {
			return "http_status", withoutURL(err)
		}
		return netReason(ctx, err), withoutURL(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.CopyN(io.Discard, resp.Body, 4096)
		return "http_status", fmt.Errorf("engine answered %s", resp.Status)
	}
	t.docType = ""
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		// a parameter that does not parse still gives the type (mime.ErrInvalidMediaParameter)
		if mt, _, err := mime.ParseMediaType(ct); (err == nil || errors.Is(err, mime.ErrInvalidMediaParameter)) && notExposition[mt] {
			t.docType = mt // read all the same: an exposition under another type is one (see scrapeTarget)
		}
	}
	t.body.Reset()
	if _, err := t.body.ReadFrom(io.LimitReader(resp.Body, s.opts.MaxBytes+1)); err != nil {
		reason := netReason(ctx, err)
		if _, ok := errors.AsType[net.Error](err); !ok && ctx.Err() == nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			reason = "malformed" // the body arrived but does not decode: a gzip that does not inflate
		}
		return reason, fmt.Errorf("cannot read the exposition: %w", err)
	}
	if int64(t.body.Len()) > s.opts.MaxBytes {
		return "too_large", fmt.Errorf("exposition over %d bytes", s.opts.MaxBytes)
	}
	return "", nil
}

// notExposition are the media types of a 200 that is no exposition unless its body has
// series of the families read: a proxy's error or login page in front of the engine, an
// API's answer, whose body may parse (empty, or comments only) and would report the engine
// up with nothing read. A body that has them is an exposition mislabelled (Flask's default
// text/html for a route returning generate_latest(), the application/json of some Rust
// exporters), read as Prometheus 2 reads it. Other types are read as they come.
var notExposition = map[string]bool{"text/html": true, "application/xhtml+xml": true, "application/json": true,
	"application/xml": true, "text/xml": true}

// errRedirect is a redirect gpuwatch does not follow.
var errRedirect = errors.New("redirect not followed")

// sameHost follows a redirect on the engine's own host and port only (Starlette answers
// /metrics with a redirect to /metrics/), or from http to https of that host on the
// default ports (a proxy that upgrades every request), at most 3: one elsewhere would have
// gpuwatch read, and publish as this engine's, what another host serves, and send requests
// wherever the engine points it; one from https to http would send the URL's query and
// credentials in clear.
func sameHost(req *http.Request, via []*http.Request) error {
	first, to := via[0].URL, req.URL
	same := strings.EqualFold(to.Hostname(), first.Hostname()) && (to.Scheme == first.Scheme && port(to) == port(first) ||
		first.Scheme == "http" && to.Scheme == "https" && port(first) == "80" && port(to) == "443")
	switch {
	case len(via) > 3:
		return fmt.Errorf("%w: more than 3 redirects", errRedirect)
	case !same:
		return fmt.Errorf("%w: to %s://%s, not the engine's host, port and scheme", errRedirect, to.Scheme, to.Host)
	}
	return nil
}

// port returns u's port, the scheme's default where it has none.
func port(u *url.URL) string {
	switch p := u.Port(); {
	case p != "":
		return p
	case u.Scheme == "https":
		return "443"
	default:
		return "80"
	}
}

// withoutURL returns err without the URL net/http puts in it, which shows the query (where
// a token may be): the log line names the target's URL redacted.
func withoutURL(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}

func netReason(ctx context.Context, err error) string {
	if ne, ok := errors.AsType[net.Error](err); (ok && ne.Timeout()) || ctx.Err() != nil {
		return "timeout"
	}
	return "connect"
}

// read sums what the families say per model: across the other labels (vLLM's engine
// core index under data parallelism, SGLang's dp_rank) additive readings add and usage
// ratios take the highest. SGLang labels each scheduler's series with its ranks: a
// data-parallel rank (dp_rank) is a scheduler of its own, with its own queue, while the
// other ranks of one (tp_rank, pp_rank, moe_ep_rank) repeat its figures when every
// scheduler exports. So only the lowest ranks of each model and dp_rank are read, or the
// same requests would be counted once per rank. The lowest, not 0: under DP attention
// the scheduler of dp_rank 3 is tp_rank 3 (and moe_ep_rank 3 with expert parallelism).
//
// A counter's or histogram's delta is the sum of its series' deltas, each against the
// series' own last value (t.series): a series gone adds nothing, a series that fell
// restarted (its delta is its value), a series with a value refused adds nothing and keeps
// its last good one, a series new to the exposition counts from zero (prometheus_client
// makes a labelled series at its first increment). The series of other ranks are tracked
// too, so that one becoming the lowest is not new.
//
// Where the engine exposes creation times (prometheus_client's _created series), they tell
// a series made anew from one that was there before: a series whose creation time changed
// since its last value was reset and counts from zero, even above its old value; a series
// unknown to the state (gone long enough to be forgotten) but made before the previous
// scrape is one back, not new, and has no delta at its return: its total was made before.
func (s *Scraper) read(t *target, fams map[string]*dto.MetricFamily, now time.Time) map[string]*state {
	t.gen++
	t.live = 0
	cur := map[string]*state{}
	byName := names[t.Engine]
	label := modelLabel(t.Engine)
	if label == "" {
		label = "\x00" // no label has this name: TGI's samples have no model
	}
	leaders, models := survey(fams, byName, label)
	kept := s.keep(t, models) // nil: every model is read
	overLimit := false
	t.readCreated()
	for name, fam := range fams {
		mp, ok := byName[name]
		if !ok || mp.isCreated {
			continue
		}
		prio := uint8(2)
		if mp.legacy {
			prio = 1
		}
		f := mp.f
		leftOut := t.leftOut[slotOfMapping(mp)]
		for _, m := range fam.GetMetric() {
			mdl, group, r := seriesRanks(m, label)
			st := cur[mdl]
			if st == nil {
				if kept != nil && !kept[mdl] {
					overLimit = true
					continue
				}
				st = &state{baseline: t.models[mdl] == nil}
				cur[mdl] = st
			}
			// read: not another rank's copy of the same scheduler's figures, nor a
			// legacy name where the current one is exported, nor a field in conflict
			read := (!r.has || r == leaders[group]) && st.from[f] <= prio && !st.conflict[f]
			if !read && f < firstCounter {
				continue
			}
			if read && st.from[f] < prio { // a current name replaces a legacy one
				st.has[f], st.counters[f], st.hists[f], st.le[f] = false, 0, nil, nil
				st.from[f] = prio
			}
			if f >= firstHistogram {
				s.readHist(t, st, f, name, mp.created, m, read, leftOut, now)
				continue
			}
			v, ok := value(fam.GetType(), m, f >= firstCounter)
			if !ok || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || (maxed(f) && v > 1) {
				if read {
					s.m.dropped.WithLabelValues(t.Name, "bad_value").Inc()
				}
				if f >= firstCounter {
					t.track(name, m, now) // exposed: its last good value is kept
				}
				continue
			}
			if f >= firstCounter {
				sv, known := t.track(name, m, now)
				c := t.createdOf(mp.created, m, now)
				remade := sv.remade(c) && t.madeSince(c)
				if known && sv.ok && !remade && v < sv.v && sv.unreset(c) {
					// fell under the creation time it had at the scrape before: no reset,
					// a value that cannot be; its last good one is kept
					if read {
						s.m.dropped.WithLabelValues(t.Name, "bad_value").Inc()
					}
					continue
				}
				d, moved := v, !known && !leftOut // a new series counts from zero; one the limit may have left out, from here
				switch {
				case !known && t.madeBefore(c):
					moved = false // back after it was forgotten: its total is not this tick's
				case sv.ok && remade:
					moved = true // made anew since its last value: counted from zero
				case sv.ok:
					moved = true
					if v >= sv.v { // else it fell: restarted, counted from zero
						d = v - sv.v
					}
				}
				sv.v, sv.ok = v, true
				if read && moved && !st.baseline {
					st.counters[f] += d
					st.has[f] = true
				}
				continue
			}
			switch {
			case !st.has[f]:
				st.counters[f] = v
			case maxed(f):
				st.counters[f] = max(st.counters[f], v)
			default:
				st.counters[f] += v
			}
			st.has[f] = true
		}
	}
	t.sweep(now)
	t.read = now
	t.leftOut = t.cache.overIn
	if overLimit {
		s.m.dropped.WithLabelValues(t.Name, "models_over_limit").Inc()
	}
	if len(cur) == 0 {
		cur[""] = &state{} // up, and exporting nothing tokenscope reads
	}
	return cur
}

// track returns the state of the series of family name with m's labels, and whether it
// was known before this scrape, and marks it seen.
func (t *target) track(name string, m *dto.Metric, now time.Time) (sv *seriesState, known bool) {
	k := seriesKey(t.key[:0], name, m) // labels sorted by name: one key whatever order they came in
	t.key = k
	sv = t.series[string(k)] // no allocation for the lookup
	known = sv != nil
	if !known {
		sv = &seriesState{}
		t.series[string(k)] = sv
	}
	if sv.gen != t.gen {
		t.live++
	}
	sv.gen, sv.seen = t.gen, now
	return sv, known
}

// sweep forgets the series unseen for seriesForget, and the oldest series gone when they
// outnumber those of the last scrape: the state is bounded by twice the series read.
func (t *target) sweep(now time.Time) {
	gone := len(t.series) - t.live
	if gone == 0 {
		return
	}
	for k, sv := range t.series {
		if sv.gen != t.gen && now.Sub(sv.seen) > seriesForget {
			delete(t.series, k)
			gone--
		}
	}
	if gone <= t.live {
		return
	}
	type goneSeries struct {
		key  string
		seen time.Time
	}
	old := make([]goneSeries, 0, gone)
	for k, sv := range t.series {
		if sv.gen != t.gen {
			old = append(old, goneSeries{k, sv.seen})
		}
	}
	slices.SortFunc(old, func(a, b goneSeries) int { return a.seen.Compare(b.seen) })
	for _, g := range old[:gone-t.live] {
		delete(t.series, g.key)
	}
}

// readCreated keeps this scrape's creation times of series, from the series of the
// _created families the parser set aside, and forgets those it does not have. A time that
// cannot be one (not positive, not finite) is none.
func (t *target) readCreated() {
	n := 0
	for _, cs := range t.cache.created {
		if !(cs.v > 0) || math.IsInf(cs.v, 0) {
			continue
		}
		t.key = appendString(t.key[:0], cs.e.name)
		for _, lp := range cs.e.pairs {
			t.key = appendString(appendString(t.key, lp.GetName()), lp.GetValue())
		}
		c := t.created[string(t.key)] // no allocation for the lookup: the engine exposes the same series at every scrape
		if c == nil {
			c = &createdTime{}
			t.created[string(t.key)] = c
		}
		c.gen, c.v = t.gen, cs.v
		n++
	}
	if len(t.created) > n {
		for k, c := range t.created {
			if c.gen != t.gen {
				delete(t.created, k)
			}
		}
	}
}

// createdOf returns the creation time of m, a series of a family whose creation times are
// the family created, or 0 when this scrape has none: a time further ahead of now than the
// clocks may be apart is none (a series cannot be made in the future).
func (t *target) createdOf(created string, m *dto.Metric, now time.Time) float64 {
	if created == "" || len(t.created) == 0 {
		return 0
	}
	t.key = seriesKey(t.key[:0], created, m)
	if c := t.created[string(t.key)]; c != nil && c.gen == t.gen { // no allocation for the lookup
		if c.v > float64(now.Add(events.MaxClockSkew).UnixNano())/1e9 {
			return 0
		}
		return c.v
	}
	return 0
}

// madeBefore reports whether a creation time c (0: none) is before the previous good
// scrape: a series made then would have been in it.
func (t *target) madeBefore(c float64) bool {
	return c != 0 && !t.read.IsZero() && c <= float64(t.read.UnixNano())/1e9
}

// madeSince reports whether a creation time c could be that of a series made since the
// previous good scrape, as one made anew since its last value must be: not before that
// scrape (by more than createdSlack). A new creation time from before it (an exposition
// alternating between two processes' times, or writing an old one anew) is no reset.
func (t *target) madeSince(c float64) bool {
	return t.read.IsZero() || c > float64(t.read.Add(-createdSlack).UnixNano())/1e9
}

// createdSlack is how far before the previous scrape a series made anew may say it was
// made: creation times written to the second.
const createdSlack = time.Second

// seriesKey appends the key of the series of family name with m's labels to dst: the name
// and each label's name and value, length-prefixed, in the labels' order (sorted by name).
func seriesKey(dst []byte, name string, m *dto.Metric) []byte {
	dst = appendString(dst, name)
	for _, lp := range m.GetLabel() {
		dst = appendString(appendString(dst, lp.GetName()), lp.GetValue())
	}
	return dst
}

// ranks are the parallel ranks of the SGLang scheduler a series is from, below its
// data-parallel rank.
type ranks struct {
	has           bool // the series carries at least one of them
	pp, tp, moeEP string
}

// less orders ranks by pp_rank, then tp_rank, then moe_ep_rank, each as a number (a
// shorter decimal is the smaller), a missing one first.
func (r ranks) less(o ranks) bool {
	for _, p := range [...][2]string{{r.pp, o.pp}, {r.tp, o.tp}, {r.moeEP, o.moeEP}} {
		a, b := p[0], p[1]
		if len(a) != len(b) {
			return len(a) < len(b)
		}
		if a != b {
			return a < b
		}
	}
	return false
}

// seriesRanks returns the series' model, the scheduler group it belongs to (model and
// dp_rank; only made when it has ranks) and its ranks in that group.
func seriesRanks(m *dto.Metric, label string) (mdl, group string, r ranks) {
	dp := ""
	for _, lp := range m.GetLabel() {
		switch lp.GetName() {
		case label:
			mdl = lp.GetValue()
		case "dp_rank":
			dp = lp.GetValue()
		case "pp_rank":
			r.pp, r.has = lp.GetValue(), true
		case "tp_rank":
			r.tp, r.has = lp.GetValue(), true
		case "moe_ep_rank":
			r.moeEP, r.has = lp.GetValue(), true
		}
	}
	if r.has {
		group = mdl + "\x00" + dp
	}
	return mdl, group, r
}

// survey returns, per model and dp_rank, the lowest ranks any series read has (the
// scheduler whose series are read), and per model how many of the families read name it.
func survey(fams map[string]*dto.MetricFamily, byName map[string]mapping, label string) (leaders map[string]ranks, models map[string]named) {
	models = map[string]named{}
	for name, fam := range fams {
		if mp, ok := byName[name]; !ok || mp.isCreated {
			continue
		}
		for _, m := range fam.GetMetric() {
			mdl, group, r := seriesRanks(m, label)
			if n := models[mdl]; n.last != fam {
				models[mdl] = named{families: n.families + 1, last: fam}
			}
			if !r.has {
				continue
			}
			if leaders == nil {
				leaders = map[string]ranks{}
			}
			if l, ok := leaders[group]; !ok || r.less(l) {
				leaders[group] = r
			}
		}
	}
	return leaders, models
}

// named is how many families name a model, and the last of them.
type named struct {
	families int
	last     *dto.MetricFamily
}

// keep returns the models read when the families name more than MaxModels, or nil when
// every model fits. Those kept are the ones the most families name (an engine's model is
// in every family it exports; a value flooding the model label of one family is in one),
// then the ones read at the previous scrape, then by name: the same models from one scrape
// to the next, whatever order the families come in.
func (s *Scraper) keep(t *target, models map[string]named) map[string]bool {
	if len(models) <= s.opts.MaxModels {
		return nil
	}
	type candidate struct {
		model    string
		families int
		known    bool // read at the previous scrape
	}
	all := make([]candidate, 0, len(models))
	for mdl, n := range models {
		_, known := t.models[mdl]
		all = append(all, candidate{mdl, n.families, known})
	}
	slices.SortFunc(all, func(a, b candidate) int {
		switch {
		case a.families != b.families:
			return b.families - a.families
		case a.known != b.known:
			if a.known {
				return -1
			}
			return 1
		}
		return strings.Compare(a.model, b.model)
	})
	kept := make(map[string]bool, s.opts.MaxModels)
	for _, c := range all[:s.opts.MaxModels] {
		kept[c.model] = true
	}
	return kept
}

// value is a gauge's or counter's value; untyped families count as either.
func value(typ dto.MetricType, m *dto.Metric, isCounter bool) (float64, bool) {
	switch {
	case typ == dto.MetricType_UNTYPED:
		return m.GetUntyped().GetValue(), m.Untyped != nil
	case isCounter && typ == dto.MetricType_COUNTER:
		return m.GetCounter().GetValue(), m.Counter != nil
	case !isCounter && typ == dto.MetricType_GAUGE:
		return m.GetGauge().GetValue(), m.Gauge != nil
	}
	return 0, false
}

// readHist reads one exposed histogram series of st's field f and adds its delta to the
// field's (read false: only tracked); created is the family of its creation times; leftOut
// says the last good scrape left series of its family out. Its drops are counted when it
// is read. Creation times tell a reset or a series back after it
// was forgotten as they do for counters (see read).
func (s *Scraper) readHist(t *target, st *state, f field, name, created string, m *dto.Metric, read, leftOut bool, now time.Time) {
	drop := func(reason string) {
		if read {
			s.m.dropped.WithLabelValues(t.Name, reason).Inc()
		}
	}
	ch, reason := cumulative(m.GetHistogram())
	sv, known := t.track(name, m, now)
	if ch == nil {
		drop(reason) // exposed: its last good value is kept
		return
	}
	old := sv.h
	if !sv.ok {
		old = nil
	}
	c := t.createdOf(created, m, now)
	back := !known && t.madeBefore(c)                    // back after it was forgotten
	anew := sv.remade(c) && t.madeSince(c) && old != nil // made anew since its last value
	if old != nil && !anew && sv.unreset(c) && slices.Equal(old.le, ch.le) && fell(ch, old) {
		drop("bad_value") // fell under the creation time it had: no reset; its last good value is kept
		return
	}
	sv.h, sv.ok = ch, true
	if !read {
		return
	}
	switch {
	case st.le[f] == nil:
		st.le[f] = ch.le
	case !slices.Equal(st.le[f], ch.le):
		drop("histogram_bounds_mismatch")
		st.has[f], st.hists[f], st.conflict[f] = false, nil, true
		return
	}
	if st.baseline || (known && old == nil) || back || (!known && leftOut) || (old != nil && !anew && !slices.Equal(old.le, ch.le)) {
		return // the model's first scrape, the series' first good value, back after it was forgotten, perhaps left out by the limit before, or new bounds
	}
	if anew {
		old = nil // counted from zero
	}
	if cap(t.counts) < len(ch.le)+1 {
		t.counts = make([]float64, events.MaxEngineBuckets+1)
	}
	d := t.counts[:len(ch.le)+1]
	count, sum, ok := histDelta(d, ch, old) // old nil: a new series, from zero
	if !ok {
		drop("histogram_malformed")
		return
	}
	dh := st.hists[f]
	if dh == nil {
		dh = &events.HistogramDelta{Le: append([]float64{}, ch.le...), Counts: make([]float64, len(d))}
		st.hists[f] = dh
	}
	for i, c := range d {
		dh.Counts[i] += c
	}
	dh.Count += count
	dh.Sum += sum
	st.has[f] = true
}

// cumulative returns h as exposed, or nil and the reason it cannot be read. One without
// its _sum cannot be read: a sum of 0 would be a mean never measured.
func cumulative(h *dto.Histogram) (*cumHist, string) {
	if h == nil || h.SampleSum == nil {
		return nil, "histogram_malformed"
	}
	bs := h.GetBucket()
	byBound := func(a, b *dto.Bucket) int {
		switch {
		case a.GetUpperBound() < b.GetUpperBound():
			return -1
		case a.GetUpperBound() > b.GetUpperBound():
			return 1
		}
		return 0
	}
	if !slices.IsSortedFunc(bs, byBound) { // engines write them in order
		bs = slices.Clone(bs)
		slices.SortFunc(bs, byBound)
	}
	bounds := make([]float64, 2*len(bs)) // le and cum in one allocation
	ch := &cumHist{count: float64(h.GetSampleCount()) + h.GetSampleCountFloat(), sum: h.GetSampleSum(),
		le: bounds[:0:len(bs)], cum: bounds[len(bs):len(bs)]}
	for _, b := range bs {
		ub := b.GetUpperBound()
		if math.IsInf(ub, +1) {
			continue
		}
		c := float64(b.GetCumulativeCount()) + b.GetCumulativeCountFloat()
		n := len(ch.le)
		// !(c >= 0) is a count that is NaN or negative: the comparisons with its neighbours let both pass
		if math.IsNaN(ub) || math.IsInf(ub, 0) || (n > 0 && ub == ch.le[n-1]) || !(c >= 0) || (n > 0 && c < ch.cum[n-1]) || c > ch.count {
			return nil, "histogram_malformed"
		}
		ch.le = append(ch.le, ub)
		ch.cum = append(ch.cum, c)
	}
	if math.IsNaN(ch.count) || math.IsInf(ch.count, 0) || math.IsNaN(ch.sum) || math.IsInf(ch.sum, 0) {
		return nil, "histogram_malformed"
	}
	if len(ch.le) > events.MaxEngineBuckets {
		return nil, "histogram_too_many_buckets"
	}
	return ch, ""
}

// fill writes st's gauges and deltas into smp; prev is the model's previous scrape, or nil.
// A field whose name changed since prev (a legacy name, then the current one) has no delta
// that tick: its series are new, not made since prev.
func (s *Scraper) fill(smp *events.EngineSample, st, prev *state) {
	for f := range firstCounter {
		if st.has[f] {
			set(smp, f, st.counters[f])
		}
	}
	if prev == nil {
		return
	}
	d := st.ts.Sub(prev.ts).Seconds()
	smp.DeltaSeconds = &d
	for f := firstCounter; f < numFields; f++ {
		if !st.has[f] || (prev.from[f] != 0 && prev.from[f] != st.from[f]) {
			continue
		}
		if f < firstHistogram {
			set(smp, f, st.counters[f])
		} else {
			setHist(smp, f, st.hists[f])
		}
	}
}

// fell reports whether any count of h is below old's (the same bounds): a restart, or
// a value that cannot be.
func fell(h, old *cumHist) bool {
	if h.count < old.count {
		return true
	}
	for i := range h.cum {
		if h.cum[i] < old.cum[i] {
			return true
		}
	}
	return false
}

// histDelta writes into d (a count per bound and one above) the observations between old
// and h (the same bounds), and returns the count and sum between them; when any count
// fell the engine restarted, and h counts from zero, as it does when old is nil. false:
// a bucket's count is negative, h is malformed.
func histDelta(d []float64, h, old *cumHist) (count, sum float64, ok bool) {
	reset := old == nil || fell(h, old)
	prevCum := 0.0
	for i := range h.cum {
		c := h.cum[i]
		if !reset {
			c -= old.cum[i]
		}
		d[i] = c - prevCum
		prevCum = c
	}
	count, sum = h.count, h.sum
	if !reset {
		count -= old.count
		sum -= old.sum
	}
	d[len(h.le)] = count - prevCum
	for _, c := range d {
		if c < 0 {
			return 0, 0, false
		}
	}
	return count, sum, true
}
