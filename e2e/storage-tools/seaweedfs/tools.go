//go:build tools

// Package tools pins SeaweedFS, whose `weed` command is the S3 server the e2e harness runs
// models from.  The import keeps `go mod tidy` from dropping its dependencies; nothing builds
// this file, the harness builds the command with `go build` in this module.
package tools

import _ "github.com/seaweedfs/seaweedfs/weed"
