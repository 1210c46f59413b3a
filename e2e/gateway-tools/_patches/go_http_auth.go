package auth

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// The harness builds Traefik against the upstream release of this package (v0.4.0), because
// the module proxy serves neither the fork Traefik's go.mod substitutes for it nor any later
// upstream commit.  Traefik's auth middlewares call two functions the fork adds; this file,
// copied into the package's directory before the build, declares them over v0.4.0's own code.

// CheckSecret reports whether password matches secret, an htpasswd-style hash (MD5-crypt,
// SHA1 or bcrypt, chosen by its prefix as BasicAuth.CheckAuth does).
func CheckSecret(password, secret string) bool {
	compare := compareFuncs[0].compare
	for _, cmp := range compareFuncs[1:] {
		if strings.HasPrefix(secret, cmp.prefix) {
			compare = cmp.compare
			break
		}
	}
	return compare([]byte(secret), []byte(password)) == nil
}

// RequireAuthStale is RequireAuth with `stale=true` in the challenge (RFC 2617, 3.2.1): the
// client's nonce expired, its credentials did not, so it may retry without asking the user.
// v0.4.0's CheckAuth never reports a stale nonce, so Traefik does not reach this.
func (a *DigestAuth) RequireAuthStale(w http.ResponseWriter, r *http.Request) {
	if len(a.clients) > a.ClientCacheSize+a.ClientCacheTolerance {
		a.Purge(a.ClientCacheTolerance * 2)
	}
	nonce := RandomKey()
	a.clients[nonce] = &digest_client{nc: 0, last_seen: time.Now().UnixNano()}
	w.Header().Set(contentType, a.Headers.V().UnauthContentType)
	w.Header().Set(a.Headers.V().Authenticate,
		fmt.Sprintf(`Digest realm="%s", nonce="%s", opaque="%s", algorithm="MD5", qop="auth", stale=true`,
			a.Realm, nonce, a.Opaque))
	w.WriteHeader(a.Headers.V().UnauthCode)
	w.Write([]byte(a.Headers.V().UnauthResponse))
}
