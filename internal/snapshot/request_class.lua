-- kube-mvp: the class of a request, as the apiserver will treat it.
--
-- The routes give each class its own timeout and retry policy: a request the apiserver
-- treats as long-running gets no timeout, and only a read (GET, HEAD) may be retried after a
-- reset. Envoy's routes could tell these apart only with regexes, which Envoy refuses once
-- their RE2 program grows past its limit (100 by default; a long group name is enough), and
-- which it would evaluate on every route before the path. So the class is decided here, once
-- per request, and the routes match it by exact header value. It follows k8s.io/apiserver:
-- RequestInfoFactory.NewRequestInfo (pkg/endpoints/request/requestinfo.go) for the verb,
-- name and subresource, BasicLongRunningRequestCheck (pkg/server/filters/longrunning.go)
-- with kube-apiserver's long-running verbs (watch, proxy) and subresources (attach, exec,
-- proxy, log, portforward), and /debug/pprof/. The test data plane checks it against those
-- functions themselves.
--
--   "upgrade"       an Upgrade header: to the HTTP/1.1 clusters, no timeout
--   "read"          GET or HEAD, not long-running: timeout, retried after a reset too
--   "watch"         GET or HEAD with the verb watch: no timeout, retried after a reset too
--   "write"         any other method, not long-running: timeout
--   "long-running"  any other long-running request (exec, attach, port-forward, proxy, log),
--                   a list whose query is longer than QUERY_PARSE_MAX (not parsed), and a
--                   list whose watch value means false or true by the rest of the query
--   "unclassified"  a path the apiserver reads differently from Envoy (a %-escape, a leading
--                   "//", no leading "/"): it decodes it, this script does not try to
--
-- Only the first four have routes of their own; "long-running", "unclassified" and a missing
-- class (the script failed) take the route without a class: no timeout, no retry after a
-- reset, which is safe for any request. The listener strips the header from clients before
-- any route or filter reads it, and the virtual host removes it before any apiserver.

local LONG_RUNNING_SUBRESOURCES = { attach = true, exec = true, proxy = true, log = true, portforward = true }

-- The longest query a list's watch parameter is looked for in. Parsing a query costs its
-- length, on every worker, before any authentication; a longer list query takes the route
-- without a class, which is safe for any request.
local QUERY_PARSE_MAX = 4096

-- split_path is Go's strings.Split(strings.Trim(path, "/"), "/"), empty segments kept.
local function split_path(path)
  local trimmed = path:gsub("^/+", ""):gsub("/+$", "")
  local parts = {}
  if trimmed == "" then return parts end
  local start = 1
  while true do
    local slash = trimmed:find("/", start, true)
    if slash == nil then
      parts[#parts + 1] = trimmed:sub(start)
      return parts
    end
    parts[#parts + 1] = trimmed:sub(start, slash - 1)
    start = slash + 1
  end
end

-- query_unescape is Go's url.QueryUnescape: "+" is a space, %XX a byte; nil if malformed.
local function query_unescape(s)
  if s:find("%", 1, true) then
    if s:find("%%[^%x]") or s:find("%%%x[^%x]") or s:find("%%%x?$") then return nil end
    s = s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end)
  end
  return (s:gsub("%+", " "))
end

-- hex_digit is the value of one hex digit's byte, or nil.
local function hex_digit(b)
  if b == nil then return nil end
  if b >= 48 and b <= 57 then return b - 48 end
  if b >= 65 and b <= 70 then return b - 55 end
  if b >= 97 and b <= 102 then return b - 87 end
  return nil
end

-- is_watch_name: the raw name QueryUnescapes to exactly "watch". It reads a character at a
-- time and stops at the first that differs, so no name costs more than five.
local function is_watch_name(raw)
  local i, n = 1, #raw
  for k = 1, 5 do
    local c = raw:byte(i)
    if c == nil then return false end
    if c == 37 then -- %XX
      local hi, lo = hex_digit(raw:byte(i + 1)), hex_digit(raw:byte(i + 2))
      if hi == nil or lo == nil then return false end
      c, i = hi * 16 + lo, i + 3
    else
      i = i + 1
    end
    if c ~= ("watch"):byte(k) then return false end
  end
  return i > n
end

-- first_watch_value is req.URL.Query()["watch"][0], or nil: Go's url.ParseQuery splits at
-- "&", skips a pair containing ";" and a pair whose name or value does not unescape. Only
-- pairs starting "w" or "%" can be named watch: the others are skipped by one find.
local function first_watch_value(query)
  local pos, n = 1, #query
  while pos <= n do
    local stop = query:find("&", pos, true) or (n + 1)
    local first = query:byte(pos)
    if first == 119 or first == 37 then
      local pair = query:sub(pos, stop - 1)
      local eq = pair:find("=", 1, true)
      if not pair:find(";", 1, true) and is_watch_name(eq and pair:sub(1, eq - 1) or pair) then
        if not eq then return "" end
        local value = query_unescape(pair:sub(eq + 1))
        if value ~= nil then return value end
      end
    end
    local next_pair = query:find("&[w%%]", stop)
    if next_pair == nil then return nil end
    pos = next_pair + 1
  end
  return nil
end

-- watch_meaning is what the apiserver makes of a watch value: "false" for "0" or "false" in
-- any ASCII case, "true" for anything else, and "ambiguous" for "false" spelt with the long s
-- (U+017F). The apiserver reads that as false when the whole query decodes into ListOptions
-- (Convert_Slice_string_To_bool, strings.EqualFold) and as a watch when another parameter does
-- not decode (NewRequestInfo's fallback, strings.ToLower); the script does not decode them all.
local function watch_meaning(v)
  if v == "0" or (#v == 5 and v:lower() == "false") then return "false" end
  if v:find("\197\191", 1, true) and v:gsub("\197\191", "s"):lower() == "false" then return "ambiguous" end
  return "true"
end

-- method_verb is RequestInfo's verb of a resource request whose path names none.
local METHOD_VERBS = { POST = "create", GET = "get", HEAD = "get", PUT = "update", PATCH = "patch", DELETE = "delete" }

-- long_running returns whether the apiserver treats the request as long-running, and its verb.
local function long_running(method, path, query)
  local parts = split_path(path)
  local nonresource = #parts < 3 or (parts[1] ~= "api" and parts[1] ~= "apis") or (parts[1] == "apis" and #parts < 4)
  if nonresource then
    local verb = method:lower()
    return verb == "watch" or verb == "proxy" or path:sub(1, 13) == "/debug/pprof/", verb
  end
  local i = parts[1] == "apis" and 4 or 3 -- after the prefix, the group if any, the version
  local verb
  if parts[i] == "watch" or parts[i] == "proxy" then
    if #parts < i + 1 then return true, "" end -- the apiserver answers 500: no retry, no timeout
    verb = parts[i]
    i = i + 1
  else
    verb = METHOD_VERBS[method] or ""
  end
  if parts[i] == "namespaces" and #parts > i + 1 and parts[i + 2] ~= "status" and parts[i + 2] ~= "finalize" then
    i = i + 2
  end
  local n = #parts - i + 1 -- RequestInfo.Parts: resource, name, subresource, ...
  local subresource = (n >= 3 and verb ~= "proxy") and parts[i + 2] or ""
  local name = n >= 2 and parts[i + 1] or ""
  if name == "" and verb == "get" then
    if #query > QUERY_PARSE_MAX then return true, "" end
    local w = first_watch_value(query)
    local meaning = w ~= nil and watch_meaning(w) or "false"
    if meaning == "ambiguous" then return true, "" end -- the route without a class: safe for both
    verb = meaning == "true" and "watch" or "list"
  end
  return verb == "watch" or verb == "proxy" or LONG_RUNNING_SUBRESOURCES[subresource] == true, verb
end

-- request_class is the class of a request (see above); upgrade: it has an Upgrade header.
local function request_class(method, target, upgrade)
  if upgrade then return "upgrade" end
  if method == nil or target == nil then return "unclassified" end
  local path, query = target, ""
  local q = target:find("?", 1, true)
  if q then path, query = target:sub(1, q - 1), target:sub(q + 1) end
  if path:sub(1, 1) ~= "/" or path:sub(1, 2) == "//" or path:find("%", 1, true) then
    return "unclassified"
  end
  local long, verb = long_running(method, path, query)
  local read = method == "GET" or method == "HEAD"
  if long then
    if read and verb == "watch" then return "watch" end
    return "long-running"
  end
  if read then return "read" end
  return "write"
end
