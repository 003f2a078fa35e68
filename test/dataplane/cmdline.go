package dataplane

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
)

// logLevels are Envoy's --log-level values (spdlog's), mapped to slog's.
var logLevels = map[string]slog.Level{
	"trace": slog.LevelDebug - 4, "debug": slog.LevelDebug, "info": slog.LevelInfo,
	"warning": slog.LevelWarn, "warn": slog.LevelWarn, "error": slog.LevelError,
	"critical": slog.LevelError + 4, "off": slog.LevelError + 8,
}

// ParseCommandLine reads Envoy's command line as Envoy's parser (TCLAP, in
// source/server/options_impl.cc) does, for the options the stand-in takes: "--name value" or
// "--name=value", -c and -l as short forms; an argument it does not know is an error, as is
// one given twice.
func ParseCommandLine(argv []string) (CommandLine, error) {
	a := CommandLine{LogLevel: slog.LevelInfo, DrainTime: defaultDrainTime, DrainStrategy: DrainGradual}
	drainStrategy := "gradual"
	valued := map[string]func(string) error{
		"config-path":  func(v string) error { a.ConfigPath = v; return nil },
		"config-yaml":  func(v string) error { a.ConfigYAML = v; return nil },
		"service-node": func(v string) error { a.ServiceNode = v; return nil },
		"service-cluster": func(v string) error {
			a.ServiceCluster = v
			return nil
		},
		// --drain-time-s: TCLAP::ValueArg<uint32_t> (options_impl.cc, OptionsImpl), read as
		// TCLAP reads a number (an istringstream): anything but a uint32 is refused.
		"drain-time-s": func(v string) error {
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return fmt.Errorf("Couldn't read argument value from string '%s'", v)
			}
			a.DrainTime = time.Duration(n) * time.Second
			return nil
		},
		// --envoy-version: the stand-in's own, the Envoy release it models (checked by Start).
		"envoy-version": func(v string) error {
			if _, err := parseEnvoyVersion(v); err != nil {
				return err
			}
			a.EnvoyVersion = v
			return nil
		},
		// --drain-strategy: a free string to TCLAP, checked after parsing (below).
		"drain-strategy": func(v string) error { drainStrategy = v; return nil },
		"log-level": func(v string) error {
			l, ok := logLevels[v]
			if !ok {
				return fmt.Errorf("Value '%s' does not meet constraint: trace|debug|info|warning|warn|error|critical|off", v)
			}
			a.LogLevel = l
			return nil
		},
	}
	short := map[string]string{"c": "config-path", "l": "log-level"}
	switches := map[string]func(){
		"reject-unknown-dynamic-fields": func() { a.RejectUnknownDynamicFields = true },
		// No hot restart in the stand-in (it has no shared memory to begin with).
		"disable-hot-restart": func() {},
		"version":             func() { a.Version = true },
	}
	seen := map[string]bool{}
	for i := 0; i < len(argv); i++ {
		arg := argv[i]
		var name, value string
		var hasValue bool
		switch {
		case strings.HasPrefix(arg, "--"):
			name, value, hasValue = strings.Cut(arg[2:], "=")
		case strings.HasPrefix(arg, "-") && len(arg) >= 2:
			long, ok := short[arg[1:]]
			if !ok {
				return a, fmt.Errorf("PARSE ERROR: Argument: %s\n             Couldn't find match for argument", arg)
			}
			name = long
		default:
			return a, fmt.Errorf("PARSE ERROR: Argument: %s\n             Couldn't find match for argument", arg)
		}
		if seen[name] {
			return a, fmt.Errorf("PARSE ERROR: Argument: --%s\n             Argument already set!", name)
		}
		seen[name] = true
		if sw, ok := switches[name]; ok {
			if hasValue {
				return a, fmt.Errorf("PARSE ERROR: Argument: --%s\n             takes no value", name)
			}
			sw()
			continue
		}
		set, ok := valued[name]
		if !ok {
			return a, fmt.Errorf("PARSE ERROR: Argument: %s\n             Couldn't find match for argument", arg)
		}
		if !hasValue {
			if i+1 >= len(argv) {
				return a, fmt.Errorf("PARSE ERROR: Argument: --%s\n             Missing a value for this argument!", name)
			}
			i++
			value = argv[i]
		}
		if err := set(value); err != nil {
			return a, fmt.Errorf("PARSE ERROR: Argument: --%s\n             %w", name, err)
		}
	}
	// OptionsImpl checks --drain-strategy once TCLAP parsed the line: "gradual" or
	// "immediate", else a MalformedArgvException "error: unknown drain-strategy '…'" (not a
	// TCLAP PARSE ERROR). Envoy's message formats --mode's value there (by mistake: "serve"
	// unless --mode is given); the stand-in, which has no --mode, names the value given.
	switch drainStrategy {
	case "gradual":
		a.DrainStrategy = DrainGradual
	case "immediate":
		a.DrainStrategy = DrainImmediate
	default:
		return a, fmt.Errorf("error: unknown drain-strategy '%s'", drainStrategy)
	}
	return a, nil
}
