//go:build tools

// Package tools pins sigs.k8s.io/kwok so that `go build sigs.k8s.io/kwok/cmd/kwok` in this
// module builds the release's own dependency versions (kwok's go.mod and go.sum). The import
// keeps `go mod tidy` from dropping the requirement; nothing builds this file.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
