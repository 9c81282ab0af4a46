package ops

import (
	"strings"
	"testing"
)

func TestRedactURL(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		got := RedactURL(in)
		if got != want {
			t.Fatalf("RedactURL(%q) = %q, want %q", in, got, want)
		}
		if strings.Contains(got, "s3cret") {
			t.Fatalf("RedactURL(%q) = %q shows the secret", in, got)
		}
	}
	f("https://api.openai.com", "https://api.openai.com")
	f("http://127.0.0.1:8000/metrics", "http://127.0.0.1:8000/metrics")
	f("http://scraper:s3cret@h:8000/metrics", "http://scraper:xxxxx@h:8000/metrics")
	f("http://s3cret@h/metrics", "http://xxxxx@h/metrics")    // a token as the user name
	f("http://sc%40r:s3%3Acret@h/", "http://sc%40r:xxxxx@h/") // escaped
	f("https://h/v1?api-version=2024-06-01&api_key=s3cret", "https://h/v1?api-version=2024-06-01&api_key=xxxxx")
	f("https://h/?key=s3cret&token=s3cret&x=1", "https://h/?key=xxxxx&token=xxxxx&x=1")
	f("https://h/?Access_Token=s3cret", "https://h/?Access_Token=xxxxx")
	f("https://h/?api%5Fkey=s3cret", "https://h/?api%5Fkey=xxxxx")
	f("https://acct.blob/c?sv=2024&sig=s3cret", "https://acct.blob/c?sv=2024&sig=xxxxx")
	f("https://fn.azurewebsites.net/api/hook?code=s3cret", "https://fn.azurewebsites.net/api/hook?code=xxxxx")
	f("https://h/?password=s3cret#s3cret", "https://h/?password=xxxxx")
	f("https://h/#s3cret", "https://h/")
	f("https:///v1?api_key=s3cret", "https:///v1?api_key=xxxxx")
	// Not parsed: the scheme and host only.
	f("http://scraper:s3cret@h:port/metrics", "http://xxxxx@h:xxxxx/…")
	f("https://apikey:s3cret", "https://apikey:xxxxx") // the @host left out
	f("http://[::1]:s3cret/x", "http://[::1]:xxxxx/…")
	f("http://[::1]:80%zz/x", "http://[::1]:80/…")
	f("https://u:s3cret@h:1%zz", "https://xxxxx@h:1/…")
	f("http://h:port/metrics?token=s3cret", "http://h:xxxxx/…")
	f("http://h:bad/x?email=a@b&token=s3cret", "http://xxxxx@b/…")
	// An @ past what url.Parse took for the host: a password with /, ? or # in it.
	f("http://user:2024/s3cret@vllm:8000/metrics", "http://xxxxx@vllm:8000/…")
	f("http://admin:8/xK3q@am:9093", "http://xxxxx@am:9093")
	f("https://user:12?s3cret@host/x", "https://xxxxx@host/…")
	f("https://user:123#s3cret@host", "https://xxxxx@host")
	f("https:/user:sk-s3cret@api.openai.com", notShown) // one slash: all of it a path
	f("http:/s3cret@h/x", notShown)
	f("http://user:pa@ss/s3cret@host", "http://xxxxx@host") // an @ in the password too
	f("http://u:s3cret@h/?email=a@b", "http://xxxxx@b")
	f("http://u:s3c/ret@h:1/x", "http://xxxxx@h:1/…")
	// No scheme: not shown.
	f("scraper:s3cret@h/metrics", notShown)
	f("s3cret@h", notShown)
	f("sk-s3cret", notShown)
	f("", notShown)
}
