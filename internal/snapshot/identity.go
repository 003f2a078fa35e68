package snapshot

import _ "embed"

// LuaScript is the script Envoy's Lua filter ("kube-mvp.identity") runs on every request:
// first the request's class (request_class.lua: read, watch, write, upgrade, long-running,
// unclassified, which the routes match by exact value), then a verified client certificate's
// Kubernetes identity (identity.lua). One chunk, so one Lua filter and one coroutine per
// request. It is static: part of the listener, whose changes drain every client connection.
var LuaScript = requestClassScript + "\n" + identityScript

//go:embed request_class.lua
var requestClassScript string

//go:embed identity.lua
var identityScript string
