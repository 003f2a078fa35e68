-- kube-mvp: a client certificate's Kubernetes identity, decided inside Envoy.
--
-- Envoy's HTTP Lua filter runs this for every request on the apiserver listener. For a
-- connection with a client certificate Envoy verified, it does what the apiserver's x509
-- authenticator would do with that certificate (k8s.io/apiserver
-- pkg/authentication/request/x509, CommonNameUserConversion) and tells the routes the
-- outcome in the decision header:
--
--   "front-proxy"      the certificate's user, groups, UID and credential ID are set in the
--                      front-proxy headers; the route sends the request to the front-proxy
--                      twin of its cluster (whose connections present the proxy certificate).
--   "own-credentials"  the apiserver's x509 authenticator would not authenticate the
--                      certificate (empty CN, several or an empty UID) but the request
--                      carries a bearer token, which the apiserver then authenticates
--                      instead: forwarded with its own credentials, no identity headers.
--   (a local 401)      the certificate is refused and there is no token; or Go cannot parse
--                      it (the apiserver's TLS handshake would fail, token or not); or its
--                      identity cannot travel in a header unchanged.
--
-- Changing a header makes Envoy match the route again (the filter's clear_route_cache, true by
-- default), now with the decision. A request with a certificate and no decision (the script
-- failed, or the route configuration gave it no header names) matches a route that refuses
-- it: identity never falls open.
--
-- The script is static: it is part of the listener, and a listener change drains every client
-- connection, watches included. Everything that varies comes from the route configuration:
-- the header names, in the virtual host's metadata under this filter's name:
--   strip_names and strip_prefixes, what every client loses first (comma-separated);
--   decision_header; user_headers, uid_headers, group_headers, credential_id_headers, every
--   name of each kind the identity is written under (comma-separated); and class_header, in
--   which every request's class (request_class.lua, which the filter runs before this script,
--   in the same chunk) is set last.
--
-- Only this subset of Envoy's Lua API is used (the test data plane implements exactly it):
-- handle:streamInfo():downstreamSslConnection() and, on it, peerCertificatePresented(),
-- peerCertificateValidated(), sha256PeerCertificateDigest(),
-- urlEncodedPemEncodedPeerCertificate(), subjectPeerCertificate() (for logs only);
-- handle:virtualHost():metadata() and get() on it (Envoy 1.36), handle:headers() with
-- get (":method" and ":path" too)/add/replace/remove and pairs(), handle:respond(),
-- handle:logWarn().

local UNAUTHORIZED = '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
  .. '"message":"Unauthorized","reason":"Unauthorized","code":401}'

local UID_OID = "1.3.6.1.4.1.57683.2" -- Kubernetes' UID attribute; not LDAP's UID.

-- Outcomes of the mapping.
local FORWARDED, REFUSED, REJECTED = "forwarded", "refused", "rejected"

-- The identity is read from the certificate's DER, as the apiserver reads it (Go's crypto/x509,
-- parser.go: parseCertificate, parseName, parseASN1String). Envoy's printed subject
-- (subjectPeerCertificate: BoringSSL's X509_NAME_print_ex) cannot serve: it does not say a
-- value's string type, and Go refuses a certificate for some types and bytes (a VisibleString,
-- a PrintableString with "é") that BoringSSL accepts and prints like any other.

local function unhex(b)
  if b == nil then return nil end
  if b >= 48 and b <= 57 then return b - 48 end   -- 0-9
  if b >= 97 and b <= 102 then return b - 87 end  -- a-f
  if b >= 65 and b <= 70 then return b - 55 end   -- A-F
  return nil
end

-- percent_decode undoes Envoy's PercentEncoding::urlEncode (%XX).
local function percent_decode(s)
  local out, i, n = {}, 1, #s
  while i <= n do
    local c = s:byte(i)
    if c == 37 then
      local hi, lo = unhex(s:byte(i + 1)), unhex(s:byte(i + 2))
      if hi == nil or lo == nil then return nil end
      out[#out + 1] = string.char(hi * 16 + lo)
      i = i + 3
    else
      out[#out + 1] = string.char(c)
      i = i + 1
    end
  end
  return table.concat(out)
end

local B64 = {}
for i = 1, 64 do
  B64[("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"):byte(i)] = i - 1
end

local PEM_BEGIN, PEM_END = "-----BEGIN CERTIFICATE-----\n", "-----END CERTIFICATE-----\n"

-- pem_der: the DER of the one block PEM_write_bio_X509 writes (base64 lines, "=" padding), or
-- nil.
local function pem_der(pem)
  if pem == nil or #pem < #PEM_BEGIN + #PEM_END or pem:sub(1, #PEM_BEGIN) ~= PEM_BEGIN
      or pem:sub(-#PEM_END) ~= PEM_END then
    return nil
  end
  local out, acc, bits, padded = {}, 0, 0, false
  for i = #PEM_BEGIN + 1, #pem - #PEM_END do
    local c = pem:byte(i)
    if c == 61 then -- "="
      padded = true
    elseif c ~= 10 then
      local v = B64[c]
      if v == nil or padded then return nil end
      acc, bits = acc * 64 + v, bits + 6
      if bits >= 8 then
        bits = bits - 8
        local byte = math.floor(acc / 2 ^ bits)
        out[#out + 1] = string.char(byte)
        acc = acc - byte * 2 ^ bits
      end
    end
  end
  return table.concat(out)
end

-- tlv reads the element at pos, which must end by last, as Go's cryptobyte does (readASN1: a
-- one-byte tag, a definite DER length of at most four bytes): its tag, the first and last
-- index of its contents and the index after it; nil if malformed.
local function tlv(s, pos, last)
  if last - pos + 1 < 2 then return nil end
  local tag, l = s:byte(pos), s:byte(pos + 1)
  if tag % 32 == 31 then return nil end
  local start = pos + 2
  if l >= 0x80 then
    local k = l - 0x80
    if k == 0 or k > 4 or pos + 1 + k > last then return nil end
    if s:byte(pos + 2) == 0 then return nil end -- not the shortest form
    l = 0
    for j = 1, k do l = l * 256 + s:byte(pos + 1 + j) end
    if l < 0x80 then return nil end -- ditto
    start = pos + 2 + k
  end
  if start + l - 1 > last then return nil end
  return tag, start, start + l - 1, start + l
end

-- oid_text is cryptobyte's ReadASN1ObjectIdentifier, dotted: arcs of at most five bytes and
-- 31 bits, none starting 0x80; nil otherwise.
local function oid_text(s, b, e)
  if b > e then return nil end
  local arcs, p = {}, b
  while p <= e do
    local v, k = 0, 0
    repeat
      if p > e or k == 5 or v >= 2 ^ 24 then return nil end
      local c = s:byte(p)
      if k == 0 and c == 0x80 then return nil end
      v, p, k = v * 128 + c % 128, p + 1, k + 1
    until c < 0x80
    if #arcs > 0 then
      arcs[#arcs + 1] = v
    elseif v < 80 then
      arcs[1], arcs[2] = math.floor(v / 40), v % 40
    else
      arcs[1], arcs[2] = 2, v - 80
    end
  end
  return table.concat(arcs, ".")
end

-- valid_utf8 is Go's utf8.Valid: well-formed, shortest form, no surrogates, <= U+10FFFF.
local function valid_utf8(s)
  local i, n = 1, #s
  while i <= n do
    local c = s:byte(i)
    local len, min
    if c < 0x80 then len = 1
    elseif c >= 0xC2 and c <= 0xDF then len, min = 2, 0x80
    elseif c >= 0xE0 and c <= 0xEF then len, min = 3, 0x800
    elseif c >= 0xF0 and c <= 0xF4 then len, min = 4, 0x10000
    else return false end
    if len > 1 then
      if i + len - 1 > n then return false end
      local cp = c % (2 ^ (7 - len))
      for k = 1, len - 1 do
        local cc = s:byte(i + k)
        if cc < 0x80 or cc > 0xBF then return false end
        cp = cp * 64 + (cc - 0x80)
      end
      if cp < min or cp > 0x10FFFF or (cp >= 0xD800 and cp <= 0xDFFF) then return false end
    end
    i = i + len
  end
  return true
end

local function utf8_char(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then
    return string.char(0xC0 + math.floor(cp / 0x40), 0x80 + cp % 0x40)
  end
  if cp < 0x10000 then
    return string.char(0xE0 + math.floor(cp / 0x1000), 0x80 + math.floor(cp / 0x40) % 0x40, 0x80 + cp % 0x40)
  end
  return string.char(0xF0 + math.floor(cp / 0x40000), 0x80 + math.floor(cp / 0x1000) % 0x40,
    0x80 + math.floor(cp / 0x40) % 0x40, 0x80 + cp % 0x40)
end

-- all_bytes: every byte of s satisfies ok (byte loops rather than patterns: byte classes
-- in patterns differ between Lua implementations).
local function all_bytes(s, ok)
  for k = 1, #s do
    if not ok(s:byte(k)) then return false end
  end
  return true
end

local PRINTABLE_PUNCTUATION = { [32] = true, [39] = true, [40] = true, [41] = true, [43] = true,
  [44] = true, [45] = true, [46] = true, [47] = true, [58] = true, [61] = true, [63] = true,
  [42] = true, [38] = true } -- " '()+,-./:=?" and "*&", which Go accepts when parsing

-- Go's x509 isPrintable.
local function printable(b)
  return (b >= 48 and b <= 57) or (b >= 65 and b <= 90) or (b >= 97 and b <= 122) or PRINTABLE_PUNCTUATION[b] == true
end

-- go_string is parseASN1String: an attribute value (tag, contents) as the Go string the
-- apiserver sees, or nil where Go refuses the certificate.
local function go_string(tag, v)
  if tag == 0x0C then -- UTF8String
    if valid_utf8(v) then return v end
  elseif tag == 0x13 then -- PrintableString
    if all_bytes(v, printable) then return v end
  elseif tag == 0x16 then -- IA5String
    if all_bytes(v, function(b) return b < 0x80 end) then return v end
  elseif tag == 0x12 then -- NumericString
    if all_bytes(v, function(b) return b == 32 or (b >= 48 and b <= 57) end) then return v end
  elseif tag == 0x14 then -- T61String: Latin-1
    local out = {}
    for k = 1, #v do out[k] = utf8_char(v:byte(k)) end
    return table.concat(out)
  elseif tag == 0x1E then -- BMPString: UCS-2, an optional 00 00 terminator stripped
    if #v % 2 ~= 0 then return nil end
    if #v >= 2 and v:byte(#v) == 0 and v:byte(#v - 1) == 0 then v = v:sub(1, #v - 2) end
    local out, k = {}, 1
    while k <= #v do
      local u = v:byte(k) * 256 + v:byte(k + 1)
      k = k + 2
      -- Go refuses surrogates (UTF-16 only) and the noncharacters FFFE, FFFF, FDD0-FDEF.
      if (u >= 0xD800 and u <= 0xDFFF) or u >= 0xFFFE or (u >= 0xFDD0 and u <= 0xFDEF) then
        return nil
      end
      out[#out + 1] = utf8_char(u)
    end
    return table.concat(out)
  end
  return nil
end

-- go_name is parseName over the contents s[b..e] of a Name: its attributes in order, each
-- { oid =, value = }; nil where Go refuses it.
local function go_name(s, b, e)
  local atvs, pos = {}, b
  while pos <= e do
    local tag, sb, se, after = tlv(s, pos, e)
    if tag ~= 0x31 then return nil end -- SET
    local p = sb
    while p <= se do
      local at, ab, ae, anext = tlv(s, p, se)
      if at ~= 0x30 then return nil end -- SEQUENCE
      local ot, ob, oe, onext = tlv(s, ab, ae)
      if ot ~= 0x06 then return nil end
      local oid = oid_text(s, ob, oe)
      local vt, vb, ve = tlv(s, onext, ae)
      if oid == nil or vt == nil then return nil end
      local v = go_string(vt, s:sub(vb, ve))
      if v == nil then return nil end
      atvs[#atvs + 1] = { oid = oid, value = v }
      p = anext
    end
    pos = after
  end
  return atvs
end

-- subject_of is parseCertificate as far as the subject: the subject's attributes, or nil and
-- why Go refuses the certificate. Both names are parsed; the rest is left to Envoy's checks.
local function subject_of(der)
  if der == nil then return nil, "no certificate" end
  local ct, cb, ce = tlv(der, 1, #der)
  if ct ~= 0x30 then return nil, "a malformed certificate" end
  local tt, pos, te = tlv(der, cb, ce)
  if tt ~= 0x30 then return nil, "a malformed certificate" end
  local vt, _, _, after = tlv(der, pos, te)
  if vt == 0xA0 then pos = after end -- [0] version
  -- serialNumber, signature, issuer, validity, subject
  local want, fields = { 0x02, 0x30, 0x30, 0x30, 0x30 }, {}
  for k = 1, 5 do
    local t, b, e, nxt = tlv(der, pos, te)
    if t ~= want[k] then return nil, "a malformed certificate" end
    fields[k], pos = { b, e }, nxt
  end
  if go_name(der, fields[3][1], fields[3][2]) == nil then return nil, "an issuer Go cannot parse" end
  local subject = go_name(der, fields[5][1], fields[5][2])
  if subject == nil then return nil, "a subject Go cannot parse" end
  return subject
end

-- forwardable: the value survives as an HTTP header value byte for byte (no control
-- characters, which Envoy refuses in a header; no leading or trailing white space, which
-- servers trim).
local function forwardable(v)
  if not all_bytes(v, function(b) return (b >= 32 or b == 9) and b ~= 127 end) then return false end
  local first, last = v:byte(1), v:byte(#v)
  return first ~= 32 and first ~= 9 and last ~= 32 and last ~= 9
end

-- identity_of maps a certificate's DER to { result=, user=, uid=, groups= } and a reason, as
-- pkix.Name.FillFromRDNSequence and CommonNameUserConversion do: the last CN, every O in
-- order, the UID attribute. A certificate Go cannot parse fails the apiserver's TLS handshake
-- (crypto/tls processCertsFromClient), bearer token or not: rejected.
local function identity_of(der)
  local atvs, err = subject_of(der)
  if atvs == nil then return { result = REJECTED }, err end
  local user, uid, uids, groups = "", nil, 0, {}
  for _, a in ipairs(atvs) do
    if a.oid == "2.5.4.3" then
      user = a.value
    elseif a.oid == "2.5.4.10" then
      if a.value ~= "" then groups[#groups + 1] = a.value end -- grants nothing, cannot be forwarded
    elseif a.oid == UID_OID then
      uid, uids = a.value, uids + 1
    end
  end
  if user == "" then return { result = REFUSED }, "an empty CommonName" end
  if uids > 1 or (uids == 1 and uid == "") then
    return { result = REFUSED }, "several UIDs or an empty one"
  end
  if not forwardable(user) or (uid ~= nil and not forwardable(uid)) then
    return { result = REJECTED }, "a value that cannot be forwarded in a header"
  end
  for _, g in ipairs(groups) do
    if not forwardable(g) then return { result = REJECTED }, "a value that cannot be forwarded in a header" end
  end
  return { result = FORWARDED, user = user, uid = uid, groups = groups }
end

-- A client keeps its certificate for many requests: the mapping is memoised per worker by
-- the certificate's SHA-256, which determines it completely. Bounded: emptied when full.
local cache, cached, CACHE_MAX = {}, 0, 4096

local function cached_identity(ssl, digest)
  local hit = cache[digest]
  if hit ~= nil then return hit[1], hit[2] end
  local pem = percent_decode(ssl:urlEncodedPemEncodedPeerCertificate())
  local id, why = identity_of(pem_der(pem))
  if cached >= CACHE_MAX then cache, cached = {}, 0 end
  cache[digest], cached = { id, why }, cached + 1
  return id, why
end

-- has_bearer_token: the request carries a bearer token the apiserver would try. Its bearer
-- authenticator reads the first Authorization value, trimmed: "bearer" in any case, a space,
-- a non-empty token. Its WebSocket authenticator (k8s.io/apiserver
-- pkg/authentication/request/websocket, ProtocolAuthenticator) reads a WebSocket request's
-- (Upgrade "websocket", a Connection token "upgrade") Sec-WebSocket-Protocol entries, split
-- at "," and trimmed as strings.TrimSpace: exactly one starting
-- "base64url.bearer.authorization.k8s.io.", whose rest decodes as unpadded base64url to
-- non-empty UTF-8, beside at least one other entry. Anything else gives no token (an empty
-- one) or an error (two, a bad encoding, no other entry), and then the certificate alone
-- decides: refused, a 401. Envoy's get() joins repeated headers with ",": for Authorization
-- the first value still decides.
local WS_PREFIX = "base64url.bearer.authorization.k8s.io."

-- trim_space is Go's strings.TrimSpace on UTF-8: ASCII white space, U+0085 and U+00A0.
local function trim_space(s)
  local changed = true
  while changed do
    changed = false
    local t = s:gsub("^[ \t\n\v\f\r]+", ""):gsub("[ \t\n\v\f\r]+$", "")
    for _, ws in ipairs({ "\194\133", "\194\160" }) do
      if t:sub(1, 2) == ws then t = t:sub(3) end
      if #t >= 2 and t:sub(-2) == ws then t = t:sub(1, -3) end
    end
    if t ~= s then s, changed = t, true end
  end
  return s
end

local B64URL = {}
for i = 1, 64 do
  B64URL[("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"):byte(i)] = i - 1
end

-- base64url_raw is Go's base64.RawURLEncoding.DecodeString (no padding; "\r" and "\n"
-- skipped), or nil.
local function base64url_raw(s)
  s = s:gsub("[\r\n]", "")
  if #s % 4 == 1 then return nil end
  local out, acc, bits = {}, 0, 0
  for i = 1, #s do
    local v = B64URL[s:byte(i)]
    if v == nil then return nil end
    acc, bits = acc * 64 + v, bits + 6
    if bits >= 8 then
      bits = bits - 8
      local byte = math.floor(acc / 2 ^ bits)
      out[#out + 1] = string.char(byte)
      acc = acc - byte * 2 ^ bits
    end
  end
  return table.concat(out)
end

-- fold_lower is strings.EqualFold's view of s for comparing with an ASCII word: the long s
-- (U+017F) folds to "s" and the Kelvin sign (U+212A) to "k".
local function fold_lower(s)
  return (s:gsub("\197\191", "s"):gsub("\226\132\170", "k"):lower())
end

local function websocket_token(headers)
  -- wsstream.IsWebSocketRequest: Upgrade is "websocket" (EqualFold), and a Connection value
  -- contains "upgrade" (httpstream.IsUpgradeRequest: a substring, in any case).
  local up, conn, protocols = headers:get("upgrade"), headers:get("connection"), headers:get("sec-websocket-protocol")
  if up == nil or fold_lower(up) ~= "websocket" or conn == nil or protocols == nil then return false end
  if not conn:lower():find("upgrade", 1, true) then return false end
  local token, others = nil, 0
  for entry in (protocols .. ","):gmatch("([^,]*),") do
    entry = trim_space(entry)
    if entry:sub(1, #WS_PREFIX) == WS_PREFIX then
      if token ~= nil then return false end -- several: the apiserver's error
      token = base64url_raw(entry:sub(#WS_PREFIX + 1))
      if token == nil or not valid_utf8(token) then return false end
    else
      others = others + 1
    end
  end
  return token ~= nil and token ~= "" and others > 0
end

local function has_bearer_token(headers)
  local auth = headers:get("authorization")
  if auth ~= nil and auth:find("^[Bb][Ee][Aa][Rr][Ee][Rr] [^ ]") ~= nil then return true end
  return websocket_token(headers)
end

-- split_names: "a,b" -> { "a", "b" } (header names never contain a comma).
local function split_names(s)
  local out = {}
  if type(s) ~= "string" then return out end
  for name in s:gmatch("[^,]+") do out[#out + 1] = name end
  return out
end

-- names: the header names of the route configuration; nil if one is missing.
local function names(md)
  if md == nil then return nil end
  local n = {
    decision = md:get("decision_header"), user = split_names(md:get("user_headers")),
    uid = split_names(md:get("uid_headers")), group = split_names(md:get("group_headers")),
    credential_id = split_names(md:get("credential_id_headers")),
  }
  if type(n.decision) ~= "string" or n.decision == "" then return nil end
  for _, key in ipairs({ "user", "uid", "group", "credential_id" }) do
    if #n[key] == 0 then return nil end
  end
  return n
end

-- strip removes what a client could claim an identity with under the apiservers' configured
-- names (the listener strips only fixed names: x-remote-*, kube-mvp's own). Prefixes need a
-- look at every header: the loop runs to its end, since Envoy refuses any change of the
-- headers while an iteration is unfinished.
local function strip(headers, md)
  for _, name in ipairs(split_names(md:get("strip_names"))) do headers:remove(name) end
  local prefixes = split_names(md:get("strip_prefixes"))
  if #prefixes == 0 then return end
  local doomed = {}
  for key, _ in pairs(headers) do
    local k = key:lower()
    for _, p in ipairs(prefixes) do
      if k:sub(1, #p) == p then
        doomed[#doomed + 1] = k
        break
      end
    end
  end
  for _, k in ipairs(doomed) do headers:remove(k) end
end

-- identity decides a client certificate's identity: sets it in the headers (every name of
-- each kind), lets the request go on with its own credentials, or answers 401 itself.
local function identity(handle, headers, md)
  local ssl = handle:streamInfo():downstreamSslConnection()
  if ssl == nil or not ssl:peerCertificatePresented() then return end
  local h = names(md)
  if h == nil then
    handle:logWarn("kube-mvp identity: the route configuration gives no header names; the request is refused")
    return
  end
  if not ssl:peerCertificateValidated() then return end -- refused by the undecided route
  local digest = ssl:sha256PeerCertificateDigest()
  local id, why = cached_identity(ssl, digest)
  if id.result == FORWARDED then
    digest = "X509SHA256=" .. digest
    for _, name in ipairs(h.user) do headers:replace(name, id.user) end
    for _, name in ipairs(h.uid) do
      if id.uid ~= nil then headers:replace(name, id.uid) end
    end
    for _, name in ipairs(h.group) do
      headers:remove(name)
      for _, g in ipairs(id.groups) do headers:add(name, g) end
    end
    for _, name in ipairs(h.credential_id) do headers:replace(name, digest) end
    headers:replace(h.decision, "front-proxy")
  elseif id.result == REFUSED and has_bearer_token(headers) then
    headers:replace(h.decision, "own-credentials")
  else
    handle:logWarn("kube-mvp identity: client certificate " .. ssl:subjectPeerCertificate() .. " refused: " .. (why or id.result))
    handle:respond({ [":status"] = "401", ["content-type"] = "application/json" }, UNAUTHORIZED)
  end
end

-- The order matters: the class is set last, so that a request whose configured identity
-- headers were not stripped, or whose identity was not decided, has none; the routes refuse
-- such a request (RouteUnclassified) rather than forward it.
function envoy_on_request(handle)
  local vh = handle:virtualHost()
  local md = vh and vh:metadata()
  if md == nil then return end
  local headers = handle:headers()
  strip(headers, md)
  -- request_class comes from request_class.lua, which precedes this script in the filter.
  local class = request_class(headers:get(":method"), headers:get(":path"), headers:get("upgrade") ~= nil)
  identity(handle, headers, md)
  local class_header = md:get("class_header")
  if type(class_header) == "string" and class_header ~= "" then
    headers:replace(class_header, class)
  end
end
