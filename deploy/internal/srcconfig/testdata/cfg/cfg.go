package cfg

import (
	"flag"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
)

type Config struct {
	Addr    string        `env:"ADDR" envDefault:"127.0.0.1:1"`
	Secret  string        `env:"SECRET,required"`
	Skipped string        // no tag: not a variable
	Wait    time.Duration `env:"WAIT" envDefault:"5s"`
	DB      chdb.Config   `envPrefix:"DB_"`
	Inner   *Inner        `envPrefix:"IN_"`
	Plain   Inner         // no prefix: its variables as they are
	Ignored string        `env:"-"`
}

type Inner struct {
	Level int `env:"LEVEL" envDefault:"3"`
}

func cmd(args []string) {
	fs := flag.NewFlagSet("cmd", flag.ContinueOnError)
	var d time.Duration
	fs.String("name", "", "")
	fs.DurationVar(&d, "wait", 0, "")
	other := flag.NewFlagSet("other", flag.ContinueOnError)
	other.Bool("verbose", false, "")
	_ = fs.Parse(args)
}
