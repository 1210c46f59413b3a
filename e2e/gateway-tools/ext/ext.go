// Package ext fills Traefik's dynamic-configuration extension point for the e2e harness.
//
// Traefik's go.mod replaces github.com/traefik/traefik/dynamic/ext with a directory of its own
// repository that its published module does not contain (the directory is a separate module),
// and the module proxy serves no version of it.  A module that builds Traefik must therefore
// supply the package itself.  Upstream's open-source build embeds empty structs here (other
// builds extend the routers' configuration); the harness needs no extension, so it declares the
// two types Traefik's dynamic configuration embeds, with no fields.
package ext

// HTTP is embedded in Traefik's dynamic HTTP configuration; it adds nothing.
type HTTP struct{}

// Router is embedded in each of Traefik's HTTP routers; it adds nothing.
type Router struct{}
