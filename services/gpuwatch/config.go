package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/envconf"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/scrape"
)

// Config is gpuwatch's whole configuration, read from the environment.
type Config struct {
	// Interval is how often every GPU is sampled; ticks fall on wall-clock multiples of it,
	// so samples from different hosts line up.
	Interval time.Duration `env:"GPUWATCH_INTERVAL" envDefault:"1s"`
	// Host names this machine in subjects and samples; empty means the hostname. It must
	// match the instance label the emitter puts on request events.
	Host string `env:"GPUWATCH_HOST"`
	// Source is where samples come from: nvml, replay or synthetic.
	Source string `env:"GPUWATCH_SOURCE" envDefault:"nvml"`
	// NVMLLibrary is the NVML shared library dlopen loads.
	NVMLLibrary string `env:"GPUWATCH_NVML_LIBRARY" envDefault:"libnvidia-ml.so.1"`
	// PCIeInterval is how often PCIe throughput is read on its own goroutine per GPU; each
	// read blocks about 20 ms inside NVML. 0 turns PCIe readings off.
	PCIeInterval time.Duration `env:"GPUWATCH_PCIE_INTERVAL" envDefault:"1s"`
	// Recheck is how long a reading that NVML said is unsupported is skipped before it is
	// tried again.
	Recheck time.Duration `env:"GPUWATCH_RECHECK" envDefault:"5m"`
	// ReplayFile is the recorded samples (JSON lines) that GPUWATCH_SOURCE=replay plays.
	ReplayFile string `env:"GPUWATCH_REPLAY_FILE"`
	// Synthetic tunes GPUWATCH_SOURCE=synthetic.
	Synthetic SyntheticConfig `envPrefix:"GPUWATCH_SYNTHETIC_"`
	// PublishBuffer is how many samples are held while NATS is away; older ones are kept
	// and new ones dropped (and counted) once it is full.
	PublishBuffer int `env:"GPUWATCH_PUBLISH_BUFFER" envDefault:"100000"`
	// PublishBytes bounds the bytes those samples hold together.
	PublishBytes int64 `env:"GPUWATCH_PUBLISH_BUFFER_BYTES" envDefault:"268435456"`
	// Engines are the inference engines' Prometheus endpoints scraped on each tick:
	// kind=URL or kind:name=URL, comma-separated, kind being vllm, sglang or tgi.
	Engines string `env:"GPUWATCH_ENGINES"`
	// EngineTimeout bounds one scrape; 0 means 80 % of the interval, at most 5s.
	EngineTimeout time.Duration `env:"GPUWATCH_ENGINE_TIMEOUT" envDefault:"0s"`
	// EngineMaxBytes is the largest exposition read; a larger one fails the scrape.
	EngineMaxBytes int64 `env:"GPUWATCH_ENGINE_MAX_BYTES" envDefault:"4194304"`
	// EngineMaxModels bounds the samples one engine gives per tick (one per model).
	EngineMaxModels int `env:"GPUWATCH_ENGINE_MAX_MODELS" envDefault:"16"`
	// EngineMaxSeries bounds the series of the families read that one engine's scrapes
	// hold (each histogram bucket one; a model has some 150, and as many per value of a
	// label of its own, such as an SGLang tenant); new ones past it are left out and counted.
	// 0 (the default) stands for 20000, or SeriesPerModel × EngineMaxModels where that is
	// more, so that raising the models alone never stops gpuwatch at start.
	EngineMaxSeries int `env:"GPUWATCH_ENGINE_MAX_SERIES" envDefault:"0"`
	// HostStats turns on the host sample (memory, disks, network from procfs) on each tick.
	HostStats bool `env:"GPUWATCH_HOST_STATS" envDefault:"true"`
	// ProcRoot and SysRoot are where the host's /proc and /sys are: in a container, the
	// host's, mounted for instance at /host/proc and /host/sys.
	ProcRoot string `env:"GPUWATCH_PROC_ROOT" envDefault:"/proc"`
	SysRoot  string `env:"GPUWATCH_SYS_ROOT" envDefault:"/sys"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `env:"GPUWATCH_LOG_LEVEL" envDefault:"info"`

	HTTPAddr string     `env:"HTTP_ADDR" envDefault:"127.0.0.1:9102"`
	NATS     bus.Config `envPrefix:"NATS_"`
}

// SyntheticConfig is the model GPUWATCH_SOURCE=synthetic runs.
type SyntheticConfig struct {
	GPUs   int           `env:"GPUS" envDefault:"2"`
	Seed   uint64        `env:"SEED" envDefault:"1"`
	Period time.Duration `env:"PERIOD" envDefault:"10m"`
}

// parseConfig reads the configuration from getenv and fills in the defaults that need the
// machine (the hostname).
func parseConfig(getenv func(string) string, hostname func() (string, error)) (Config, error) {
	cfg, err := envconf.Parse[Config](getenv)
	if err != nil {
		return cfg, err
	}
	if cfg.Host == "" {
		h, err := hostname()
		if err != nil {
			return cfg, fmt.Errorf("cannot read the hostname for GPUWATCH_HOST (set it explicitly): %w", err)
		}
		cfg.Host = h
	}
	if cfg.EngineTimeout == 0 {
		cfg.EngineTimeout = min(cfg.Interval*4/5, 5*time.Second)
	}
	if cfg.EngineMaxSeries == 0 {
		cfg.EngineMaxSeries = max(20000, cfg.EngineMaxModels*scrape.SeriesPerModel)
	}
	return cfg, cfg.Validate()
}

// Validate names the first bad variable.
func (c Config) Validate() error {
	switch {
	case c.Interval < 10*time.Millisecond || c.Interval > time.Hour:
		return fmt.Errorf("GPUWATCH_INTERVAL=%s must be between 10ms and 1h", c.Interval)
	case strings.TrimSpace(c.Host) == "":
		return errors.New("GPUWATCH_HOST is blank")
	case len(c.Host) > events.MaxLabelLen:
		return fmt.Errorf("GPUWATCH_HOST is %d bytes, over the %d a label may have", len(c.Host), events.MaxLabelLen)
	case !utf8.ValidString(c.Host):
		return fmt.Errorf("GPUWATCH_HOST=%q is not UTF-8", c.Host)
	case strings.TrimSpace(c.Host) != c.Host || strings.IndexFunc(c.Host, unicode.IsControl) >= 0:
		// the emitter's instance label never has them: the host would match no request
		return fmt.Errorf("GPUWATCH_HOST=%q must not hold spaces around it or control characters", c.Host)
	case c.PCIeInterval < 0:
		return fmt.Errorf("GPUWATCH_PCIE_INTERVAL=%s must not be negative (0 turns PCIe readings off)", c.PCIeInterval)
	case c.PCIeInterval > 0 && c.PCIeInterval < 50*time.Millisecond:
		return fmt.Errorf("GPUWATCH_PCIE_INTERVAL=%s must be at least 50ms: each PCIe read takes about 20ms", c.PCIeInterval)
	case c.Recheck <= 0:
		return fmt.Errorf("GPUWATCH_RECHECK=%s must be positive", c.Recheck)
	case c.PublishBuffer < 1:
		return fmt.Errorf("GPUWATCH_PUBLISH_BUFFER=%d must be at least 1", c.PublishBuffer)
	case c.PublishBytes < 1<<20:
		return fmt.Errorf("GPUWATCH_PUBLISH_BUFFER_BYTES=%d must be at least 1048576", c.PublishBytes)
	case c.HTTPAddr == "":
		return errors.New("HTTP_ADDR is empty")
	case c.EngineTimeout < 0 || c.EngineTimeout >= c.Interval:
		return fmt.Errorf("GPUWATCH_ENGINE_TIMEOUT=%s must be positive and below GPUWATCH_INTERVAL=%s", c.EngineTimeout, c.Interval)
	case c.EngineMaxBytes < 1024 || c.EngineMaxBytes > 256<<20:
		return fmt.Errorf("GPUWATCH_ENGINE_MAX_BYTES=%d must be 1024 to 268435456", c.EngineMaxBytes)
	case c.EngineMaxModels < 1 || c.EngineMaxModels > 1024:
		return fmt.Errorf("GPUWATCH_ENGINE_MAX_MODELS=%d must be 1 to 1024", c.EngineMaxModels)
	case c.EngineMaxSeries < 1000 || c.EngineMaxSeries > 1_000_000:
		return fmt.Errorf("GPUWATCH_ENGINE_MAX_SERIES=%d must be 1000 to 1000000", c.EngineMaxSeries)
	case c.EngineMaxSeries < c.EngineMaxModels*scrape.SeriesPerModel:
		return fmt.Errorf("GPUWATCH_ENGINE_MAX_SERIES=%d cannot hold the GPUWATCH_ENGINE_MAX_MODELS=%d models of some %d series each: raise it to %d at least, or lower GPUWATCH_ENGINE_MAX_MODELS",
			c.EngineMaxSeries, c.EngineMaxModels, scrape.SeriesPerModel, c.EngineMaxModels*scrape.SeriesPerModel)
	}
	if _, err := scrape.ParseTargets(c.Engines); err != nil {
		return err
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return err
	}
	switch c.Source {
	case events.SourceNVML:
		if c.NVMLLibrary == "" {
			return errors.New("GPUWATCH_NVML_LIBRARY is empty")
		}
	case events.SourceReplay:
		if c.ReplayFile == "" {
			return errors.New("GPUWATCH_REPLAY_FILE is empty: GPUWATCH_SOURCE=replay needs a recorded samples file")
		}
		if _, err := os.Stat(c.ReplayFile); err != nil {
			return fmt.Errorf("GPUWATCH_REPLAY_FILE=%s cannot be read: %w", c.ReplayFile, err)
		}
	case events.SourceSynthetic:
		switch {
		case c.Synthetic.GPUs < 1 || c.Synthetic.GPUs > 1024:
			return fmt.Errorf("GPUWATCH_SYNTHETIC_GPUS=%d must be 1 to 1024", c.Synthetic.GPUs)
		case c.Synthetic.Period < time.Second:
			return fmt.Errorf("GPUWATCH_SYNTHETIC_PERIOD=%s must be at least 1s", c.Synthetic.Period)
		}
	default:
		return fmt.Errorf("GPUWATCH_SOURCE=%q must be nvml, replay or synthetic", c.Source)
	}
	return c.NATS.Validate()
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("GPUWATCH_LOG_LEVEL=%q must be debug, info, warn or error", s)
	}
	return l, nil
}
