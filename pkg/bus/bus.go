package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// Config is how services reach NATS; services nest it with envPrefix "NATS_".
type Config struct {
	URL      string `env:"URL" envDefault:"nats://127.0.0.1:4222"`
	Creds    string `env:"CREDS"` // a .creds file (JWT and NKey)
	User     string `env:"USER"`
	Password string `env:"PASSWORD"`
	TLSCA    string `env:"TLS_CA"`   // CA bundle to verify the server
	TLSCert  string `env:"TLS_CERT"` // client certificate, with TLS_KEY
	TLSKey   string `env:"TLS_KEY"`

	ConnectTimeout time.Duration `env:"CONNECT_TIMEOUT" envDefault:"5s"`

	Streams StreamLimits `envPrefix:"STREAM_"`
}

// StreamLimits bound what the streams keep. MaxAge 0 keeps each stream's own default
// (events and samples 3 days, rollups and feedback 7 days, alerts 30 days).
type StreamLimits struct {
	MaxAge          time.Duration `env:"MAX_AGE" envDefault:"0s"`
	MaxBytes        int64         `env:"MAX_BYTES" envDefault:"1073741824"`
	DuplicateWindow time.Duration `env:"DUPLICATE_WINDOW" envDefault:"2m"`
	Replicas        int           `env:"REPLICAS" envDefault:"1"`
}

// Validate names the first bad variable.
func (c Config) Validate() error {
	u, err := url.Parse(strings.Split(c.URL, ",")[0])
	switch {
	case c.URL == "":
		return errors.New("NATS_URL is empty")
	case err != nil || u.Host == "":
		return fmt.Errorf("NATS_URL=%q is not a URL such as nats://127.0.0.1:4222", redact(c.URL))
	case c.Creds != "" && c.User != "":
		return errors.New("NATS_CREDS and NATS_USER are both set: choose one")
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return errors.New("NATS_TLS_CERT and NATS_TLS_KEY must be set together")
	case c.ConnectTimeout <= 0:
		return fmt.Errorf("NATS_CONNECT_TIMEOUT=%s must be positive", c.ConnectTimeout)
	case c.Streams.MaxAge < 0:
		return fmt.Errorf("NATS_STREAM_MAX_AGE=%s must not be negative", c.Streams.MaxAge)
	case c.Streams.MaxBytes < -1 || c.Streams.MaxBytes == 0:
		return fmt.Errorf("NATS_STREAM_MAX_BYTES=%d must be positive (or -1 for no limit)", c.Streams.MaxBytes)
	case c.Streams.DuplicateWindow <= 0:
		return fmt.Errorf("NATS_STREAM_DUPLICATE_WINDOW=%s must be positive", c.Streams.DuplicateWindow)
	case c.Streams.Replicas < 1 || c.Streams.Replicas > 5:
		return fmt.Errorf("NATS_STREAM_REPLICAS=%d must be 1 to 5", c.Streams.Replicas)
	}
	return nil
}

// Connect dials NATS with the configured credentials and keeps reconnecting for ever, so a
// service outlives a NATS restart. Connection state changes are logged once each.
func Connect(cfg Config, name string, logger *slog.Logger) (*nats.Conn, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts := []nats.Option{
		nats.Name(name),
		nats.Timeout(cfg.ConnectTimeout),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.RetryOnFailedConnect(false),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() {
				return // the service closed it: not lost
			}
			logger.Warn("disconnected from NATS", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			logger.Info("reconnected to NATS", "url", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(asyncErrors(logger, time.Minute)),
	}
	switch {
	case cfg.Creds != "":
		opts = append(opts, nats.UserCredentials(cfg.Creds))
	case cfg.User != "":
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	}
	if cfg.TLSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.TLSCA))
	}
	if cfg.TLSCert != "" {
		opts = append(opts, nats.ClientCert(cfg.TLSCert, cfg.TLSKey))
	}
	nc, err := nats.Connect(cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to NATS at %s: %w", redact(cfg.URL), err)
	}
	return nc, nil
}

// asyncErrors logs what the NATS client reports outside any call (a slow consumer dropping
// messages, a permission refused): the first of each kind of error, then at most one line per
// every for it, with how many came meanwhile. Without a handler nats.go prints them to stderr.
func asyncErrors(logger *slog.Logger, every time.Duration) nats.ErrHandler {
	var mu sync.Mutex
	type seen struct {
		at     time.Time
		missed int
	}
	last := map[string]*seen{}
	return func(_ *nats.Conn, sub *nats.Subscription, err error) {
		if err == nil {
			return
		}
		kind := err.Error()
		mu.Lock()
		defer mu.Unlock()
		s := last[kind]
		if s == nil {
			if len(last) >= 64 { // kinds of errors are few; never let them grow the map
				clear(last)
			}
			s = &seen{}
			last[kind] = s
		}
		now := time.Now()
		if !s.at.IsZero() && now.Sub(s.at) < every {
			s.missed++
			return
		}
		attrs := []any{"err", err, "since_last_logged", s.missed}
		if sub != nil {
			attrs = append(attrs, "subject", sub.Subject)
		}
		logger.Warn("NATS client error", attrs...)
		s.at, s.missed = now, 0
	}
}

// redact hides any user:password of a URL list before it is logged or returned: whatever
// comes between each URL's scheme and its last @ is replaced, so a password is never shown,
// even in a URL that does not parse (one with characters a URL cannot hold).
func redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		start := 0
		if j := strings.Index(p, "://"); j >= 0 {
			start = j + len("://")
		}
		if at := strings.LastIndexByte(p[start:], '@'); at >= 0 {
			parts[i] = p[:start] + "xxxxx" + p[start+at:]
		}
	}
	return strings.Join(parts, ",")
}

// StreamConfigs returns the configuration of every stream under the given limits.
func StreamConfigs(l StreamLimits) []jetstream.StreamConfig {
	age := func(def time.Duration) time.Duration {
		if l.MaxAge > 0 {
			return l.MaxAge
		}
		return def
	}
	const day = 24 * time.Hour
	mk := func(name, desc string, subjects []string, maxAge time.Duration) jetstream.StreamConfig {
		return jetstream.StreamConfig{
			Name:        name,
			Description: desc,
			Subjects:    subjects,
			Storage:     jetstream.FileStorage,
			Retention:   jetstream.LimitsPolicy,
			Discard:     jetstream.DiscardOld,
			MaxAge:      maxAge,
			MaxBytes:    l.MaxBytes,
			Duplicates:  min(l.DuplicateWindow, maxAge),
			Replicas:    l.Replicas,
		}
	}
	return []jetstream.StreamConfig{
		mk(events.StreamEvents, "tokenscope request events", []string{events.SubjectRequestsAll}, age(3*day)),
		mk(events.StreamGPU, "tokenscope GPU samples", []string{events.SubjectGPUSamplesAll}, age(3*day)),
		mk(events.StreamEngine, "tokenscope inference-engine samples", []string{events.SubjectEngineSamplesAll}, age(3*day)),
		mk(events.StreamHost, "tokenscope host samples", []string{events.SubjectHostSamplesAll}, age(3*day)),
		mk(events.StreamRollups, "tokenscope token, GPU and host rollups", []string{events.SubjectRollupsAll}, age(7*day)),
		mk(events.StreamAlerts, "tokenscope alerts", []string{events.SubjectAlertsAll}, age(30*day)),
		// Feedback has a stream of its own: the request consumers read all of LLM_EVENTS and
		// are untouched by it.
		mk(events.StreamFeedback, "tokenscope feedback events", []string{events.SubjectFeedbackAll}, age(7*day)),
	}
}

// EnsureStreams creates the named streams, or updates them to the configuration when they
// exist, so any start order of the services works. With no names it ensures all of them.
// On a NATS cluster that is still forming it retries (see retryForming), and so it does for
// a moment on a stream just deleted (see retryStore).
func EnsureStreams(ctx context.Context, js jetstream.JetStream, l StreamLimits, names ...string) error {
	for _, cfg := range StreamConfigs(l) {
		if len(names) > 0 && !contains(names, cfg.Name) {
			continue
		}
		err := retryForming(ctx, func(ctx context.Context) error {
			return retryStore(ctx, func() error {
				_, err := js.CreateOrUpdateStream(ctx, cfg)
				return err
			})
		})
		if err != nil {
			return fmt.Errorf("cannot create or update stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

// FormingPatience is how long the Ensure functions retry while a NATS cluster forms: a
// service started with its cluster waits for it rather than exit, and one pointed at a
// cluster that cannot place the streams (fewer servers than NATS_STREAM_REPLICAS) still
// gets its error.
const FormingPatience = time.Minute

// formingAttempt bounds one request to a forming cluster, which may leave it unanswered.
const formingAttempt = 10 * time.Second

// retryForming calls do until it succeeds, fails with an error a forming cluster does not
// give, ctx ends, or FormingPatience has passed; it returns do's last error. Each call gets
// formingAttempt at most.
func retryForming(ctx context.Context, do func(context.Context) error) error {
	deadline := time.Now().Add(FormingPatience)
	wait := 50 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, formingAttempt)
		err := do(actx)
		cancel()
		if err == nil || !forming(err) || ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// jsStoreCreate is what nats-server answers creating a stream whose deleted namesake's store
// it has not yet removed: "error creating store for stream".
const jsStoreCreate jetstream.ErrorCode = 10049

// retryStore calls do until it fails with another error than jsStoreCreate, at most 8 times
// over about 2.5 s: a stream deleted by hand and made again at once (a start right after
// `nats stream rm`) waits for nats-server to remove the old store rather than exit.
func retryStore(ctx context.Context, do func() error) error {
	wait := 20 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := do()
		var apiErr *jetstream.APIError
		if err == nil || !errors.As(err, &apiErr) || apiErr.ErrorCode != jsStoreCreate || attempt == 8 {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// The JetStream API errors of a cluster whose meta leader is being elected, or does not yet
// know enough of its peers to place a stream's replicas.
const (
	jsClusterNoPeers  jetstream.ErrorCode = 10005 // no suitable peers for placement
	jsClusterNotAvail jetstream.ErrorCode = 10008 // JetStream system temporarily unavailable
)

// forming reports whether err is what a NATS cluster that is still forming answers: worth
// retrying in a moment.
func forming(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jsClusterNoPeers || apiErr.ErrorCode == jsClusterNotAvail
	}
	// No meta leader yet to answer in time.
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// ConsumerConfig describes a durable pull consumer.
type ConsumerConfig struct {
	Stream        string
	Durable       string
	FilterSubject string
	AckPolicy     jetstream.AckPolicy // default AckExplicit
	AckWait       time.Duration       // default 30s
	MaxAckPending int                 // default 1000 (the server's); -1 for no limit
	MaxDeliver    int                 // default unlimited
	DeliverPolicy jetstream.DeliverPolicy
	OptStartSeq   uint64
}

// EnsureConsumer creates or updates a durable pull consumer on its stream.
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, c ConsumerConfig) (jetstream.Consumer, error) {
	cfg := jetstream.ConsumerConfig{
		Durable:       c.Durable,
		Name:          c.Durable,
		FilterSubject: c.FilterSubject,
		AckPolicy:     c.AckPolicy,
		AckWait:       c.AckWait,
		MaxAckPending: c.MaxAckPending,
		MaxDeliver:    c.MaxDeliver,
		DeliverPolicy: c.DeliverPolicy,
		OptStartSeq:   c.OptStartSeq,
		MaxWaiting:    512,
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, c.Stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot create or update consumer %s on %s: %w", c.Durable, c.Stream, err)
	}
	return cons, nil
}

// EnsureKeyValue creates or updates a file-backed key-value bucket keeping only each key's
// latest value, as the services keep their checkpoints, and returns it; it retries on a
// forming cluster as EnsureStreams does.
func EnsureKeyValue(ctx context.Context, js jetstream.JetStream, bucket, description string, replicas int) (jetstream.KeyValue, error) {
	return EnsureKeyValueHistory(ctx, js, bucket, description, replicas, 1)
}

// EnsureKeyValueHistory is EnsureKeyValue keeping history values of each key (1 to 64); a
// bucket that exists is updated to it.
func EnsureKeyValueHistory(ctx context.Context, js jetstream.JetStream, bucket, description string, replicas int, history uint8) (jetstream.KeyValue, error) {
	cfg := jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: description,
		History:     max(history, 1),
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	}
	var kv jetstream.KeyValue
	err := retryForming(ctx, func(ctx context.Context) error {
		var err error
		kv, err = js.CreateOrUpdateKeyValue(ctx, cfg)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cannot create or update key-value bucket %s: %w", bucket, err)
	}
	return kv, nil
}
