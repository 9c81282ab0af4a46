package chdb

import (
	"fmt"
	"strconv"
	"strings"
)

// Version is a ClickHouse server version.
type Version struct{ Major, Minor int }

// ParseVersion parses what SELECT version() returns, such as "18.16.1" or "25.3.2.39".
func ParseVersion(s string) (Version, error) {
	parts := strings.Split(strings.TrimSpace(s), ".")
	if len(parts) < 2 {
		return Version{}, fmt.Errorf("cannot parse ClickHouse version %q", s)
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return Version{}, fmt.Errorf("cannot parse ClickHouse version %q", s)
	}
	return Version{Major: major, Minor: minor}, nil
}

// AtLeast reports whether v is major.minor or newer.
func (v Version) AtLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

func (v Version) String() string { return strconv.Itoa(v.Major) + "." + strconv.Itoa(v.Minor) }
