//go:build tools

// Package tools pins Traefik (its Kubernetes Gateway API provider is the e2e gateway) for the
// e2e harness.  The import keeps `go mod tidy` from dropping its dependencies; nothing builds
// this file, the harness builds the command with `go build` in this module.
package tools

import (
	_ "github.com/traefik/traefik/v3/cmd/traefik"
)
