package snapshot

import _ "embed"

// IdentityScript is the Lua script that Envoy's Lua filter runs on every request to map a
// verified client certificate to its Kubernetes identity (identity.lua explains it). It is
// static: part of the listener, whose changes drain every client connection.
//
//go:embed identity.lua
var IdentityScript string
