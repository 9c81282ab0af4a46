package ops

import (
	"net/url"
	"strings"
)

// redacted is what RedactURL puts in place of a secret.
const redacted = "xxxxx"

// secretWords mark a query parameter whose value is a secret: ?key= (Google), ?api_key=,
// ?token=, ?access_token=, ?sig= (Azure SAS), ?code= (Azure Functions), ?password=, ….
var secretWords = []string{"key", "token", "secret", "pass", "pwd", "auth", "sig", "cred", "session", "code", "jwt"}

// RedactURL returns raw, an endpoint URL from the configuration, as logs and errors may
// show it: the password of its user information replaced by xxxxx (a user name alone by
// xxxxx too, since a token is often put there), the value of each query parameter whose
// name holds key, token, secret, pass, pwd, auth, sig, cred, session, code or jwt replaced
// by xxxxx, and its fragment dropped. Its scheme, host, path and other parameters are kept.
//
// A value that does not parse as a URL (http://user:pass@host:port), or has an @ that is not
// its user information's (http://user:2024/pass@host), shows only its scheme and host, with xxxxx@ in front when it has an @ and a port that is not a number as
// xxxxx, since where its secrets are cannot be told; one with no scheme
// (user:password@host, or a key given by mistake) is not shown.
func RedactURL(raw string) string {
	raw = strings.TrimSpace(raw)
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" || u.Scheme == "" || strayAt(raw, u) {
		return redactUnparsed(raw)
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), redacted)
		} else {
			u.User = url.User(redacted)
		}
	}
	u.Fragment, u.RawFragment = "", ""
	if u.RawQuery != "" {
		parts := strings.Split(u.RawQuery, "&")
		for i, p := range parts {
			name, _, ok := strings.Cut(p, "=")
			if n, err := url.QueryUnescape(name); err == nil {
				name = n
			}
			if ok && secretName(name) {
				parts[i] = p[:strings.IndexByte(p, '=')+1] + redacted
			}
		}
		u.RawQuery = strings.Join(parts, "&")
	}
	return u.String()
}

// strayAt reports whether raw has an @ other than the one that ends its user information,
// which may belong to a password url.Parse took for a host, a path or a query:
// http://user:2024/s3cret@host (host user:2024), https:/user:key@host (a path),
// http://user:pa@ss/s3cret@host (user information user:pa).
func strayAt(raw string, u *url.URL) bool {
	n := strings.Count(raw, "@")
	if n == 0 {
		return false
	}
	if u.User == nil || n > 1 {
		return true
	}
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return true
	}
	end := strings.IndexAny(rest, "/?#")
	return end >= 0 && strings.IndexByte(rest, '@') > end
}

func secretName(name string) bool {
	name = strings.ToLower(name)
	for _, w := range secretWords {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// notShown stands for a value RedactURL cannot tell a secret in.
const notShown = "(not shown: not a URL, it may hold a secret)"

// redactUnparsed keeps the scheme and the host of raw: what follows its last @ up to the
// first character a host cannot hold.
func redactUnparsed(raw string) string {
	i := strings.Index(raw, "://")
	if i <= 0 || !isScheme(raw[:i]) {
		return notShown
	}
	var b strings.Builder
	b.WriteString(raw[:i+3])
	rest := raw[i+3:]
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		b.WriteString(redacted + "@")
		rest = rest[at+1:]
	}
	end := strings.IndexFunc(rest, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(".-_:[]", r))
	})
	if end < 0 {
		end = len(rest)
	}
	host := rest[:end]
	// A port that is not a number may be a password whose @host was left out
	// (https://user:sk-…).
	if i := strings.LastIndexByte(host, ':'); i > strings.LastIndexByte(host, ']') && strings.Trim(host[i+1:], "0123456789") != "" {
		host = host[:i+1] + redacted
	}
	b.WriteString(host)
	if end < len(rest) {
		b.WriteString("/…")
	}
	return b.String()
}

func isScheme(s string) bool {
	for i, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && (r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.')) {
			return false
		}
	}
	return s != ""
}
