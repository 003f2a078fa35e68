package dataplane

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"

	luafilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	lua "github.com/yuin/gopher-lua"
	"github.com/yuin/gopher-lua/parse"
	"google.golang.org/protobuf/types/known/structpb"
)

// Envoy's HTTP Lua filter (envoy.extensions.filters.http.lua.v3.Lua), the request path only,
// on an embedded Lua 5.1 VM (gopher-lua; Envoy runs LuaJIT, whose language is Lua 5.1). The
// API is exactly the subset internal/snapshot/identity.lua uses; calling anything else is a
// Lua runtime error here. What is modelled as Envoy does it, the API, and Envoy's sources:
// test/dataplane/README.md#the-lua-filter.

// luaFilterCfg is one Lua filter of an HTTP connection manager.
type luaFilterCfg struct {
	name  string // the filter's name: its key in typed_per_filter_config
	stats string // counter prefix below the connection manager's, "lua." + stat_prefix
	def   *luaScript
	named map[string]*luaScript // source_codes
}

// luaRouteCfg is a compiled LuaPerRoute.
type luaRouteCfg struct {
	disabled bool
	name     string
}

// luaScript is one script: its compiled chunk and the Lua states ("workers") it runs in.
type luaScript struct {
	proto *lua.FunctionProto
	mu    sync.Mutex
	idle  []*luaVM
	made  int
	cond  *sync.Cond
}

// luaWorkers is how many Lua states a script gets, as Envoy has one per worker thread.
var luaWorkers = max(2, runtime.GOMAXPROCS(0))

type luaVM struct {
	L          *lua.LState
	onRequest  *lua.LFunction         // nil: the script does not hook requests
	metatables map[string]*lua.LTable // luaMetatables, built once per state
}

func compileLua(filterName string, c *luafilterv3.Lua) (*luaFilterCfg, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	out := &luaFilterCfg{name: filterName, stats: "lua", named: map[string]*luaScript{}}
	if c.GetStatPrefix() != "" {
		out.stats = "lua." + c.GetStatPrefix()
	}
	if ds := c.GetDefaultSourceCode(); ds != nil {
		s, err := loadLua("default_source_code", ds.GetInlineString())
		if err != nil {
			return nil, fmt.Errorf("default_source_code: %w", err)
		}
		out.def = s
	}
	for _, k := range sortedKeys(c.GetSourceCodes()) {
		s, err := loadLua(k, c.GetSourceCodes()[k].GetInlineString())
		if err != nil {
			return nil, fmt.Errorf("source_codes[%s]: %w", k, err)
		}
		out.named[k] = s
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func compileLuaPerRoute(c *luafilterv3.LuaPerRoute) (*luaRouteCfg, error) {
	// PGV: the override is required, disabled must be true, name non-empty.
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.GetFilterContext() != nil {
		// Not in our minimum Envoy, and not used: refused rather than ignored.
		return nil, fmt.Errorf("filter_context is not implemented")
	}
	return &luaRouteCfg{disabled: c.GetDisabled(), name: c.GetName()}, nil
}

// loadLua compiles a script and runs it once in a first state, as Envoy does at load.
func loadLua(name, src string) (*luaScript, error) {
	chunk, err := parse.Parse(strings.NewReader(src), name)
	if err != nil {
		return nil, fmt.Errorf("script load error: %w", err)
	}
	proto, err := lua.Compile(chunk, name)
	if err != nil {
		return nil, fmt.Errorf("script load error: %w", err)
	}
	s := &luaScript{proto: proto}
	s.cond = sync.NewCond(&s.mu)
	vm, err := s.newVM()
	if err != nil {
		return nil, err
	}
	s.idle, s.made = []*luaVM{vm}, 1
	return s, nil
}

func (s *luaScript) newVM() (*luaVM, error) {
	// A request's coroutine (NewThread) gets a registry and call stack of these sizes, grown
	// on demand: gopher-lua's defaults (5,120 registry slots, allocated per coroutine) were
	// half of the filter's time per request. Only the stand-in's cost, not a limit: the
	// registry grows to the default maximum.
	L := lua.NewState(lua.Options{SkipOpenLibs: true, RegistrySize: 256, RegistryMaxSize: 256 * 20 * 64, RegistryGrowStep: 256, CallStackSize: 200, MinimizeStackMemory: true})
	for _, lib := range []struct {
		name string
		fn   lua.LGFunction
	}{{lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}, {lua.StringLibName, lua.OpenString}, {lua.MathLibName, lua.OpenMath}} {
		L.Push(L.NewFunction(lib.fn))
		L.Push(lua.LString(lib.name))
		L.Call(1, 0)
	}
	luaPairsMetamethod(L)
	L.Push(L.NewFunctionFromProto(s.proto))
	if err := L.PCall(0, 0, nil); err != nil {
		L.Close()
		return nil, fmt.Errorf("script load error: %w", err)
	}
	vm := &luaVM{L: L, metatables: luaMetatables(L)}
	if fn, ok := L.GetGlobal("envoy_on_request").(*lua.LFunction); ok {
		vm.onRequest = fn
	}
	return vm, nil
}

// get takes a state: an idle one, a new one while there are fewer than luaWorkers, else it
// waits for one.
func (s *luaScript) get() (*luaVM, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if n := len(s.idle); n > 0 {
			vm := s.idle[n-1]
			s.idle = s.idle[:n-1]
			return vm, nil
		}
		if s.made < luaWorkers {
			s.made++
			s.mu.Unlock()
			vm, err := s.newVM()
			s.mu.Lock()
			if err != nil {
				s.made--
			}
			return vm, err
		}
		s.cond.Wait()
	}
}

func (s *luaScript) put(vm *luaVM) {
	s.mu.Lock()
	s.idle = append(s.idle, vm)
	s.mu.Unlock()
	s.cond.Signal()
}

// luaPerRoute is the most specific LuaPerRoute for the filter on rt (nil: none).
func luaPerRoute(rt *route, filter string) *luaRouteCfg {
	if rt == nil {
		return nil
	}
	if c := rt.lua[filter]; c != nil {
		return c
	}
	if rt.vh != nil {
		return rt.vh.lua[filter]
	}
	return nil
}

// luaSSL is what the script sees of the downstream TLS connection.
type luaSSL struct {
	peer      *x509.Certificate // nil: none presented
	validated bool
}

// luaRequest is what the Lua filter reads and changes of a request. The stream implements it;
// the identity tests drive the filter through it directly.
type luaRequest struct {
	hdr        *headerList
	pseudo     func(name string) (string, bool) // :authority, :path, :method, :scheme
	ssl        *luaSSL                          // nil: not a TLS connection
	routeClear bool                             // the route cache was cleared
	// reply is the local reply respond() asked for (nil: none).
	reply *luaReply
}

type luaReply struct {
	status  int
	body    string
	headers []kv
}

// luaOutcome of running a filter for a request.
type luaOutcome struct {
	ran bool  // a script ran
	err error // the script's runtime error (the request continues)
}

// run runs the filter's request script for req, given the request's route.
func (f *luaFilterCfg) run(rt *route, req *luaRequest, log func(level, msg string)) luaOutcome {
	pr := luaPerRoute(rt, f.name)
	script := f.def
	// The virtual host's metadata under the filter's configured name only: Envoy's
	// StreamHandleWrapper::luaVirtualHost (source/extensions/filters/http/lua/lua_filter.cc)
	// gives VirtualHostWrapper the filter's config name, and VirtualHostWrapper::getMetadata
	// (wrappers.cc) looks up that key alone, with no fallback to envoy.filters.http.lua.
	var vhMeta *structpb.Struct
	if rt != nil && rt.vh != nil {
		vhMeta = rt.vh.filterMetadata[f.name]
	}
	if pr != nil {
		switch {
		case pr.disabled:
			return luaOutcome{}
		case pr.name != "":
			script = f.named[pr.name] // none: nothing runs
		}
	}
	if script == nil {
		return luaOutcome{}
	}
	vm, err := script.get()
	if err != nil {
		return luaOutcome{ran: true, err: err}
	}
	defer script.put(vm)
	if vm.onRequest == nil {
		return luaOutcome{}
	}
	h := &luaHandle{req: req, vm: vm, vhMeta: vhMeta, log: log}
	L := vm.L
	co, cancel := L.NewThread()
	if cancel != nil {
		defer cancel()
	}
	state, rerr, _ := L.Resume(co, vm.onRequest, h.userdata(L))
	h.dead = true // the handle and its objects must not outlive the call
	if state == lua.ResumeError {
		return luaOutcome{ran: true, err: rerr}
	}
	// ResumeYield: respond() ended the script (the coroutine is never resumed).
	return luaOutcome{ran: true}
}

// luaHandle is the stream handle and the objects it hands out.
type luaHandle struct {
	req    *luaRequest
	vm     *luaVM
	vhMeta *structpb.Struct
	log    func(level, msg string)
	dead   bool
	// The objects are created once per handle, as Envoy's wrappers are.
	headers, streamInfo, ssl, virtualHost, vhMetadata *lua.LUserData
	// iterating: a pairs() over the headers has not reached its end (HeaderMapWrapper's
	// iterator_): no change of the headers, and no second iteration, until it does.
	iterating bool
}

// luaObject is the value of every userdata the filter hands a script: the request's handle
// and which of Envoy's wrappers it stands for.
type luaObject struct {
	h    *luaHandle
	kind string
}

// luaMethod is one method of a wrapper; self is the request's handle.
type luaMethod func(h *luaHandle, L *lua.LState) int

// luaClasses are Envoy's wrapper classes as far as the script uses them: their methods by
// name (the metatable's __index, as Envoy's BaseLuaObject does: any other key reads nil).
// Every Lua state builds one metatable per class (luaMetatables), so a request only makes
// the userdata it hands out, as Envoy only makes its wrapper objects.
var luaClasses = map[string]map[string]luaMethod{
	"stream handle": {
		"headers": func(h *luaHandle, L *lua.LState) int {
			return h.pushObject(L, &h.headers, "header map")
		},
		"streamInfo": func(h *luaHandle, L *lua.LState) int {
			return h.pushObject(L, &h.streamInfo, "stream info")
		},
		// StreamHandleWrapper::luaVirtualHost: the matched virtual host, whose metadata() is
		// its filter_metadata under the filter's name (empty without one).
		"virtualHost": func(h *luaHandle, L *lua.LState) int {
			return h.pushObject(L, &h.virtualHost, "virtual host")
		},
		"respond": (*luaHandle).respond,
		// StreamHandleWrapper::luaLogWarn -> scriptLog at warn.
		"logWarn": func(h *luaHandle, L *lua.LState) int {
			h.log("warn", L.CheckString(2))
			return 0
		},
	},
	"stream info": {
		// StreamInfoWrapper::luaDownstreamSslConnection: nil without TLS.
		"downstreamSslConnection": func(h *luaHandle, L *lua.LState) int {
			if h.req.ssl == nil {
				L.Push(lua.LNil)
				return 1
			}
			return h.pushObject(L, &h.ssl, "ssl connection")
		},
	},
	"virtual host": {
		"metadata": func(h *luaHandle, L *lua.LState) int {
			return h.pushObject(L, &h.vhMetadata, "metadata")
		},
	},
	"metadata": {
		// MetadataMapWrapper::luaGet: the value converted to Lua, nil if absent.
		"get": func(h *luaHandle, L *lua.LState) int {
			key := L.CheckString(2)
			v, ok := h.vhMeta.GetFields()[key]
			if !ok {
				L.Push(lua.LNil)
				return 1
			}
			L.Push(luaValue(L, v))
			return 1
		},
	},
	"header map":     luaHeaderMethods,
	"ssl connection": luaSSLMethods,
}

// luaMetatables builds, in a new Lua state, one metatable per class whose methods check their
// self argument as Envoy does (luaL_checkudata: an object of that class; LuaDeathRef: the
// request it belongs to is still running) and then run.
func luaMetatables(L *lua.LState) map[string]*lua.LTable {
	out := make(map[string]*lua.LTable, len(luaClasses))
	for kind, methods := range luaClasses {
		index := L.NewTable()
		for name, fn := range methods {
			index.RawSetString(name, L.NewFunction(func(L *lua.LState) int {
				ud, _ := L.Get(1).(*lua.LUserData)
				var self *luaObject
				if ud != nil {
					self, _ = ud.Value.(*luaObject)
				}
				if self == nil || self.kind != kind {
					L.RaiseError("%s.%s: bad self argument (call it with ':')", kind, name)
				}
				if self.h.dead {
					L.RaiseError("object used outside of proper scope")
				}
				return fn(self.h, L)
			}))
		}
		mt := L.NewTable()
		mt.RawSetString("__index", index)
		if kind == "header map" {
			mt.RawSetString("__pairs", L.NewFunction(luaHeaderPairs))
		}
		out[kind] = mt
	}
	return out
}

// object makes a userdata of the given class for this request.
func (h *luaHandle) object(L *lua.LState, kind string) *lua.LUserData {
	ud := L.NewUserData()
	ud.Value = &luaObject{h: h, kind: kind}
	L.SetMetatable(ud, h.vm.metatables[kind])
	return ud
}

// pushObject pushes the request's object of the given class, made on first use: Envoy's
// wrappers are made once per handle too.
func (h *luaHandle) pushObject(L *lua.LState, slot **lua.LUserData, kind string) int {
	if *slot == nil {
		*slot = h.object(L, kind)
	}
	L.Push(*slot)
	return 1
}

func (h *luaHandle) userdata(L *lua.LState) *lua.LUserData {
	return h.object(L, "stream handle")
}

// luaValue converts a metadata value as MetadataMapWrapper::setValue does.
func luaValue(L *lua.LState, v *structpb.Value) lua.LValue {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return lua.LString(k.StringValue)
	case *structpb.Value_NumberValue:
		return lua.LNumber(k.NumberValue)
	case *structpb.Value_BoolValue:
		return lua.LBool(k.BoolValue)
	case *structpb.Value_StructValue:
		t := L.NewTable()
		for name, f := range k.StructValue.GetFields() {
			t.RawSetString(name, luaValue(L, f))
		}
		return t
	case *structpb.Value_ListValue:
		t := L.NewTable()
		for i, e := range k.ListValue.GetValues() {
			t.RawSetInt(i+1, luaValue(L, e))
		}
		return t
	}
	return lua.LNil
}

// luaPairsMetamethod makes pairs() honour a __pairs metamethod, as LuaJIT built with
// LUAJIT_ENABLE_LUA52COMPAT (Envoy's build) does and Lua 5.1 (gopher-lua) does not: the
// metamethod's results, else the built-in pairs.
func luaPairsMetamethod(L *lua.LState) {
	builtin := L.GetGlobal("pairs")
	L.SetGlobal("pairs", L.NewFunction(func(L *lua.LState) int {
		v := L.CheckAny(1)
		if mm := L.GetMetaField(v, "__pairs"); mm != lua.LNil {
			L.Push(mm)
			L.Push(v)
			L.Call(1, 3)
			return 3
		}
		L.Push(builtin)
		L.Push(v)
		L.Call(1, 3)
		return 3
	}))
}

// luaHeaderPairs is HeaderMapWrapper::luaPairs: an iterator over a snapshot of every header
// entry (pseudo-headers first, as Envoy's request header map keeps them; a repeated header is
// one entry per value), returning key and value. While it has not returned its last entry the
// headers cannot be changed ("header map cannot be modified while iterating",
// checkModifiable) nor iterated again ("cannot create a second iterator before completing the
// first"): a script that breaks out of the loop can change no header after it.
func luaHeaderPairs(L *lua.LState) int {
	ud, _ := L.Get(1).(*lua.LUserData)
	self, _ := ud.Value.(*luaObject)
	if self == nil || self.kind != "header map" {
		L.RaiseError("header map.__pairs: bad self argument")
	}
	h := self.h
	if h.dead {
		L.RaiseError("object used outside of proper scope")
	}
	if h.iterating {
		L.RaiseError("cannot create a second iterator before completing the first")
	}
	var entries []kv
	for _, p := range []string{":authority", ":path", ":method", ":scheme"} {
		if v, ok := h.req.pseudo(p); ok {
			entries = append(entries, kv{p, v})
		}
	}
	entries = append(entries, *h.req.hdr...)
	h.iterating = true
	next := 0
	L.Push(L.NewFunction(func(L *lua.LState) int {
		if next == len(entries) {
			h.iterating = false
			return 0
		}
		e := entries[next]
		next++
		L.Push(lua.LString(e.name))
		L.Push(lua.LString(e.value))
		return 2
	}))
	return 1
}

// luaModify is HeaderMapWrapper's checkModifiable: no change while an iterator is open;
// before any change, the filter's onHeadersModified clears the route cache
// (Lua.clear_route_cache unset: true).
func luaModify(h *luaHandle, L *lua.LState) string {
	if h.iterating {
		L.RaiseError("header map cannot be modified while iterating")
	}
	key := strings.ToLower(L.CheckString(2))
	if strings.HasPrefix(key, ":") {
		L.RaiseError("modifying the pseudo-header %s is not implemented by the test data plane", key)
	}
	h.req.routeClear = true
	return key
}

// luaHeaderMethods are HeaderMapWrapper's (source/extensions/filters/http/lua/wrappers.cc).
var luaHeaderMethods = map[string]luaMethod{
	// luaGet: every value of the header joined with "," (getAllOfHeaderAsString), nil if
	// there is none.
	"get": func(h *luaHandle, L *lua.LState) int {
		key := strings.ToLower(L.CheckString(2))
		var v string
		var ok bool
		if strings.HasPrefix(key, ":") {
			v, ok = h.req.pseudo(key)
		} else {
			v, ok = h.req.hdr.get(key)
		}
		if !ok {
			L.Push(lua.LNil)
		} else {
			L.Push(lua.LString(v))
		}
		return 1
	},
	// luaAdd: addCopy, another value after any existing ones.
	"add": func(h *luaHandle, L *lua.LState) int {
		key := luaModify(h, L)
		h.req.hdr.add(key, L.CheckString(3))
		return 0
	},
	// luaReplace: setCopy, which removes every value and adds this one.
	"replace": func(h *luaHandle, L *lua.LState) int {
		key := luaModify(h, L)
		h.req.hdr.set(key, L.CheckString(3))
		return 0
	},
	// luaRemove: every value.
	"remove": func(h *luaHandle, L *lua.LState) int {
		key := luaModify(h, L)
		h.req.hdr.del(key)
		return 0
	},
}

// luaSSLMethods are SslConnectionWrapper's (source/extensions/filters/common/lua/wrappers.cc)
// over the connection's Ssl::ConnectionInfo.
var luaSSLMethods = map[string]luaMethod{
	"peerCertificatePresented": func(h *luaHandle, L *lua.LState) int {
		ssl := h.req.ssl
		L.Push(lua.LBool(ssl.peer != nil))
		return 1
	},
	"peerCertificateValidated": func(h *luaHandle, L *lua.LState) int {
		ssl := h.req.ssl
		L.Push(lua.LBool(ssl.peer != nil && ssl.validated))
		return 1
	},
	// subjectPeerCertificate: X509_NAME_print_ex(XN_FLAG_RFC2253), "" without a certificate.
	"subjectPeerCertificate": func(h *luaHandle, L *lua.LState) int {
		ssl := h.req.ssl
		s := ""
		if ssl.peer != nil {
			s = rfc2253(ssl.peer.RawSubject)
		}
		L.Push(lua.LString(s))
		return 1
	},
	// urlEncodedPemEncodedPeerCertificate: the PEM of the certificate's DER
	// (PEM_write_bio_X509: 64-character lines, each ending "\n"), every byte but ALPHA, DIGIT
	// and "*-._" written %XX (ConnectionInfoImplBase::urlEncodedPemEncodedPeerCertificate,
	// Http::Utility::PercentEncoding::urlEncode); "" without one.
	"urlEncodedPemEncodedPeerCertificate": func(h *luaHandle, L *lua.LState) int {
		ssl := h.req.ssl
		s := ""
		if ssl.peer != nil {
			s = percentEncode(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ssl.peer.Raw}))
		}
		L.Push(lua.LString(s))
		return 1
	},
	// sha256PeerCertificateDigest: lower-case hex of the SHA-256 of the DER, "" without one.
	"sha256PeerCertificateDigest": func(h *luaHandle, L *lua.LState) int {
		ssl := h.req.ssl
		s := ""
		if ssl.peer != nil {
			sum := sha256.Sum256(ssl.peer.Raw)
			s = hex.EncodeToString(sum[:])
		}
		L.Push(lua.LString(s))
		return 1
	},
}

// percentEncode is Envoy's PercentEncoding::urlEncode: upper-case %XX for every byte but
// ALPHA, DIGIT, "*", "-", "." and "_".
func percentEncode(b []byte) string {
	var s strings.Builder
	for _, c := range b {
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("*-._", c) >= 0 {
			s.WriteByte(c)
		} else {
			fmt.Fprintf(&s, "%%%02X", c)
		}
	}
	return s.String()
}

// respond is StreamHandleWrapper::luaRespond: a table of headers (a value may be a table of
// values), an optional body; :status must be 200-599. Envoy then sends a local reply
// (DecoderCallbacks::respond -> sendLocalReply with details "lua_response", so
// local_reply_config applies, the script's headers added to it) and yields: the script ends.
func (h *luaHandle) respond(L *lua.LState) int {
	tbl := L.CheckTable(2)
	body := ""
	if L.GetTop() >= 3 && L.Get(3) != lua.LNil {
		body = L.CheckString(3)
	}
	var headers []kv
	var errs []string
	str := func(v lua.LValue) (string, bool) {
		switch v := v.(type) {
		case lua.LString:
			return string(v), true
		case lua.LNumber:
			return v.String(), true
		}
		return "", false
	}
	tbl.ForEach(func(k, v lua.LValue) {
		key, ok := k.(lua.LString)
		if !ok {
			errs = append(errs, "header key must be a string")
			return
		}
		add := func(v lua.LValue) {
			s, ok := str(v)
			if !ok {
				errs = append(errs, "header value must be a string")
				return
			}
			headers = append(headers, kv{strings.ToLower(string(key)), s})
		}
		if t, isTable := v.(*lua.LTable); isTable {
			t.ForEach(func(_, e lua.LValue) { add(e) })
		} else {
			add(v)
		}
	})
	if len(errs) > 0 {
		L.RaiseError("%s", errs[0])
	}
	status := -1
	var extra []kv
	for _, e := range headers {
		switch {
		case e.name == ":status":
			if status == -1 {
				status, _ = strconv.Atoi(e.value)
			}
		case strings.HasPrefix(e.name, ":"), e.name == "content-length":
			// The local reply's own.
		default:
			extra = append(extra, e)
		}
	}
	if status < 200 || status >= 600 {
		L.RaiseError(":status must be between 200-599")
	}
	sort.SliceStable(extra, func(i, j int) bool { return extra[i].name < extra[j].name })
	h.req.reply = &luaReply{status: status, body: body, headers: extra}
	return L.Yield()
}

// runLua runs one Lua filter for the stream; false when it answered the request.
func (st *stream) runLua(f *luaFilterCfg, rt *route) (clear, ok bool) {
	req := &luaRequest{hdr: &st.hdr, pseudo: st.pseudoHeader}
	if st.r.TLS != nil {
		req.ssl = &luaSSL{}
		if pc := st.r.TLS.PeerCertificates; len(pc) > 0 {
			req.ssl.peer = pc[0]
			// SslHandshakerImpl::peerCertificateValidated (source/common/tls/ssl_handshaker.cc)
			// is the status the certificate validator's callback set in this handshake;
			// BoringSSL does not call it on a resumed session, whose certificate (kept in
			// the session) is still presented, with its subject and digest.
			req.ssl.validated = len(st.r.TLS.VerifiedChains) > 0 && !st.r.TLS.DidResume
		}
	}
	d := st.d
	out := f.run(rt, req, func(level, msg string) {
		d.log.Warn("lua script log", "filter", f.name, "level", level, "message", msg)
	})
	if out.err != nil {
		// Filter::scriptError: the errors counter and an error log; the request continues.
		d.stats.inc(st.prefix() + f.stats + ".errors")
		d.log.Error("lua script error", "filter", f.name, "error", out.err)
	}
	if r := req.reply; r != nil {
		st.localReply(r.status, r.body, "lua_response", r.headers...)
		return false, false
	}
	return req.routeClear, true
}

func (st *stream) pseudoHeader(name string) (string, bool) {
	switch name {
	case ":method", ":path", ":authority", ":scheme":
		return st.headerForMatch(name)
	}
	return "", false
}
