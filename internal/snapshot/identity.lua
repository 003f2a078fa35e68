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
--   "own-credentials"  the apiserver would reject the certificate (empty CN, several or an
--                      empty UID, an attribute printed as DER that is not a string Go reads)
--                      but the request carries a bearer token, which the apiserver then
--                      authenticates instead: forwarded with its own credentials, no
--                      identity headers.
--   (a local 401)      the certificate is rejected and there is no token, or its identity
--                      cannot travel in a header unchanged.
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
-- peerCertificateValidated(), subjectPeerCertificate(), sha256PeerCertificateDigest();
-- handle:virtualHost():metadata() and get() on it (Envoy 1.36), handle:headers() with
-- get (":method" and ":path" too)/add/replace/remove and pairs(), handle:respond(),
-- handle:logWarn().

local UNAUTHORIZED = '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
  .. '"message":"Unauthorized","reason":"Unauthorized","code":401}'

local UID_OID = "1.3.6.1.4.1.57683.2" -- Kubernetes' UID attribute; not LDAP's UID.

-- Outcomes of the mapping.
local FORWARDED, REFUSED, REJECTED = "forwarded", "refused", "rejected"

local function unhex(b)
  if b == nil then return nil end
  if b >= 48 and b <= 57 then return b - 48 end   -- 0-9
  if b >= 97 and b <= 102 then return b - 87 end  -- a-f
  if b >= 65 and b <= 70 then return b - 55 end   -- A-F
  return nil
end

-- Characters BoringSSL escapes with a backslash (XN_FLAG_RFC2253); any other escaped
-- character, or one of ";<>\"" unescaped, means the string is not what we think it is.
local ESCAPABLE = { [" "] = true, [","] = true, ["+"] = true, ['"'] = true, ["\\"] = true,
  ["<"] = true, [">"] = true, [";"] = true, ["#"] = true }

-- parse_dn parses a subject as Envoy prints it (BoringSSL X509_NAME_print_ex with
-- XN_FLAG_RFC2253): TYPE=value attributes joined by "," between RDNs and "+" inside one, in
-- reverse certificate order; \XX escapes bytes; a value starting with an unescaped "#" is the
-- hex of its DER (attributes without a short name, or not strings). The RDN grouping does not
-- matter to the mapping, so the result is flat: { {typ=, value=, dumped=}, ... }.
local function parse_dn(s)
  local avas, i, n = {}, 1, #s
  if n == 0 then return avas end
  while true do
    local start = i
    while i <= n and s:sub(i, i) ~= "=" do
      local c = s:sub(i, i)
      if c == "," or c == "+" or c == "\\" or c == '"' or c == ";" or c == "<" or c == ">" then
        return nil, "unexpected " .. c .. " in an attribute type"
      end
      i = i + 1
    end
    if i > n or i == start then return nil, "an attribute without a type or '='" end
    local a = { typ = s:sub(start, i - 1) }
    i = i + 1
    if s:sub(i, i) == "#" then
      a.dumped = true
      start = i + 1
      i = start
      while i <= n and s:sub(i, i) ~= "," and s:sub(i, i) ~= "+" do
        if unhex(s:byte(i)) == nil then return nil, a.typ .. ": bad hex" end
        i = i + 1
      end
      a.value = s:sub(start, i - 1)
    else
      local buf = {}
      while i <= n do
        local c = s:sub(i, i)
        if c == "," or c == "+" then break end
        if c == "\\" then
          if i == n then return nil, a.typ .. ": a dangling backslash" end
          local hi = unhex(s:byte(i + 1))
          if hi ~= nil then
            local lo = unhex(s:byte(i + 2))
            if lo == nil then return nil, a.typ .. ": a bad \\XX escape" end
            buf[#buf + 1] = string.char(hi * 16 + lo)
            i = i + 3
          else
            local e = s:sub(i + 1, i + 1)
            if not ESCAPABLE[e] then return nil, a.typ .. ": an unexpected escape" end
            buf[#buf + 1] = e
            i = i + 2
          end
        elseif c == '"' or c == ";" or c == "<" or c == ">" then
          return nil, a.typ .. ": an unescaped " .. c
        else
          buf[#buf + 1] = c
          i = i + 1
        end
      end
      a.value = table.concat(buf)
    end
    avas[#avas + 1] = a
    if i > n then return avas end
    i = i + 1 -- the "," or "+"
    if i > n then return nil, "a trailing separator" end
  end
end

local function from_hex(h)
  if #h % 2 ~= 0 then return nil end
  local out = {}
  for k = 1, #h, 2 do
    local hi, lo = unhex(h:byte(k)), unhex(h:byte(k + 1))
    if hi == nil or lo == nil then return nil end
    out[#out + 1] = string.char(hi * 16 + lo)
  end
  return table.concat(out)
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

-- Go's asn1 PrintableString.
local function printable(b)
  return (b >= 48 and b <= 57) or (b >= 65 and b <= 90) or (b >= 97 and b <= 122) or PRINTABLE_PUNCTUATION[b] == true
end

-- der_string decodes one DER value the way Go's encoding/asn1 (the apiserver's certificate
-- parsing) turns a string attribute into a Go string; nil for anything Go does not decode
-- to a string, which makes the apiserver fail the certificate.
local function der_string(der)
  if der == nil or #der < 2 then return nil end
  local tag, l = der:byte(1), der:byte(2)
  local pos = 3
  if l >= 0x80 then
    local k = l - 0x80
    if k == 0 or k > 3 or #der < 2 + k then return nil end -- indefinite or huge: not DER
    l = 0
    for j = 1, k do l = l * 256 + der:byte(2 + j) end
    if der:byte(3) == 0 or l < 0x80 then return nil end -- not the shortest form
    pos = 3 + k
  end
  if #der - pos + 1 ~= l then return nil end -- one value, nothing after it
  local v = der:sub(pos)
  if tag == 0x0C then -- UTF8String
    if valid_utf8(v) then return v end
  elseif tag == 0x13 then -- PrintableString
    if all_bytes(v, printable) then return v end
  elseif tag == 0x16 then -- IA5String
    if all_bytes(v, function(b) return b < 0x80 end) then return v end
  elseif tag == 0x12 then -- NumericString
    if all_bytes(v, function(b) return b == 32 or (b >= 48 and b <= 57) end) then return v end
  elseif tag == 0x14 then -- T61String: Go reads it as Latin-1
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

-- forwardable: the value survives as an HTTP header value byte for byte (no control
-- characters, which Envoy refuses in a header; no leading or trailing white space, which
-- servers trim).
local function forwardable(v)
  if not all_bytes(v, function(b) return (b >= 32 or b == 9) and b ~= 127 end) then return false end
  local first, last = v:byte(1), v:byte(#v)
  return first ~= 32 and first ~= 9 and last ~= 32 and last ~= 9
end

local function kind(typ)
  local t = typ:upper()
  if t == "CN" or typ == "2.5.4.3" then return "cn" end
  if t == "O" or typ == "2.5.4.10" then return "o" end
  if typ == UID_OID then return "uid" end
  return nil
end

-- identity maps a printed subject to { result=, user=, uid=, groups= } and a reason.
local function identity(subject)
  local avas, err = parse_dn(subject)
  if avas == nil then return { result = REJECTED }, err end
  local user, uid, uids, groups = "", nil, 0, {}
  -- Printed in reverse: walk backwards so that the last CN wins and the groups keep the
  -- certificate's order, as Go's pkix.Name does.
  for k = #avas, 1, -1 do
    local a = avas[k]
    local what = kind(a.typ)
    -- Any attribute printed as its DER must be a string Go decodes: else Go cannot parse the
    -- certificate at all, which the apiserver then fails.
    if a.dumped and der_string(from_hex(a.value)) == nil then
      return { result = REFUSED }, a.typ .. " is not a string Go reads"
    end
    if what == "uid" then
      local v = a.value
      if a.dumped then v = der_string(from_hex(a.value)) end
      uid, uids = v, uids + 1
    elseif what ~= nil then
      if a.dumped then return { result = REFUSED }, a.typ .. " is not printed as a string" end
      if what == "cn" then
        user = a.value
      elseif a.value ~= "" then -- an empty O cannot be forwarded and grants nothing
        groups[#groups + 1] = a.value
      end
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
-- the printed subject, which determines it completely. Bounded: emptied when full.
local cache, cached, CACHE_MAX = {}, 0, 4096

local function cached_identity(subject)
  local hit = cache[subject]
  if hit ~= nil then return hit[1], hit[2] end
  local id, why = identity(subject)
  if cached >= CACHE_MAX then cache, cached = {}, 0 end
  cache[subject], cached = { id, why }, cached + 1
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
  local subject = ssl:subjectPeerCertificate()
  local id, why = cached_identity(subject)
  if id.result == FORWARDED then
    local digest = "X509SHA256=" .. ssl:sha256PeerCertificateDigest()
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
    handle:logWarn("kube-mvp identity: client certificate " .. subject .. " refused: " .. (why or id.result))
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
