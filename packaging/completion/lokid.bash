# bash completion for lokid and lokictl
# Presets are the files in $LOKI_CONFIG_DIR/presets (default /etc/loki/presets).

_lokid_presets() {
    local dir="${LOKI_CONFIG_DIR:-/etc/loki}/presets" f
    for f in "$dir"/*.toml; do
        [ -e "$f" ] || continue
        f="${f##*/}"
        printf '%s\n' "${f%.toml}"
    done
}

# Sets the caller's cur, prev, words and cword (bash's dynamic scope), with
# bash-completion's _init_completion when it is there.
_lokid_init() {
    _init_completion 2>/dev/null || {
        cur="${COMP_WORDS[COMP_CWORD]}"; prev="${COMP_WORDS[COMP_CWORD-1]}"
        words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD
    }
}

_lokid() {
    local cur prev words cword
    _lokid_init
    local commands="plan run bench check prestart engine generate watch daemon gateway rpc-worker gpu-nodes"
    local i cmd=""
    for ((i = 1; i < cword; i++)); do
        case "${words[i]}" in
            plan|run|bench|check|prestart|engine|generate|watch|daemon|gateway|rpc-worker|gpu-nodes) cmd="${words[i]}"; break ;;
        esac
    done
    case "$prev" in
        --config-dir) COMPREPLY=($(compgen -d -- "$cur")); return ;;
        --bus) COMPREPLY=($(compgen -W "system session" -- "$cur")); return ;;
        --runner) COMPREPLY=($(compgen -W "auto systemd local" -- "$cur")); return ;;
        --predict|--prompt|--repeat) return ;;
        --preset) COMPREPLY=($(compgen -W "$(_lokid_presets)" -- "$cur")); return ;;
    esac
    case "$cmd" in
        "") COMPREPLY=($(compgen -W "$commands --config-dir --debug --version --help" -- "$cur")) ;;
        plan) COMPREPLY=($(compgen -W "$(_lokid_presets) --json" -- "$cur")) ;;
        run|prestart|engine) COMPREPLY=($(compgen -W "$(_lokid_presets)" -- "$cur")) ;;
        bench) COMPREPLY=($(compgen -W "$(_lokid_presets) --full --predict --prompt --repeat --json" -- "$cur")) ;;
        generate) COMPREPLY=($(compgen -d -- "$cur")) ;;
        check) COMPREPLY=($(compgen -W "--preset --rpc" -- "$cur")) ;;
        daemon) COMPREPLY=($(compgen -W "--bus --bus-address --runner" -- "$cur")) ;;
    esac
}

# The keys `lokictl set` and `unset` know (lokid/ctl/edit.py's KNOWN_KEYS); env. takes a
# variable's name after the dot.
_lokictl_keys="model ctx gpus gpu_count gpu_layers ubatch port mmproj extra_args env. op_offload_min_batch
spec.mode spec.draft spec.n_max spec.sampling chat.reasoning_effort chat.temperature chat.top_p
chat.top_k chat.min_p serve.on_demand serve.idle_stop serve.group serve.drain kind url
upstream_model serve.keep rpc api_key_file cpu_fallback example aliases serve.replicas
serve.max_replicas"

# The values of the keys that take one of a fixed set, as lokid's configuration checks
# them (lokid/core/config/files.py: SPEC_MODES, SPEC_SAMPLINGS, EFFORT_LEVELS, and
# lokid/core/config/external.py: KINDS; a test keeps
# them equal).
_lokictl_values() {
    case "$1" in
        spec.mode) echo "off auto mtp ngram mtp+ngram" ;;
        spec.sampling) echo "greedy probabilistic" ;;
        chat.reasoning_effort) echo "none minimal low medium high xhigh" ;;
        serve.on_demand) echo "true false" ;;
        kind) echo "engine external" ;;
    esac
}

# Completes a preset's keys for set (KEY=, no space after) or unset (KEY), and after "=" the
# value of a key with a fixed set of them (nothing for the others). Bash splits "mode=au" at
# the "=" (COMP_WORDBREAKS): the word is then "=" (nothing typed after it yet) or the one
# before it is; without "=" in COMP_WORDBREAKS the word is all of "mode=au".
_lokictl_key() {
    local key="" typed=""
    if [ "$cur" = "=" ]; then key="$prev"
    elif [ "$prev" = "=" ]; then key="${words[cword-2]}"; typed="$cur"
    elif [[ "$cur" == *=* ]]; then key="${cur%%=*}"; typed="${cur#*=}"
    fi
    if [ -n "$key" ] || [ "$cur" = "=" ] || [ "$prev" = "=" ]; then
        [ "$1" = set ] || return
        COMPREPLY=($(compgen -W "$(_lokictl_values "$key")" -- "$typed"))
        # the word bash replaces is all of "mode=au" when "=" does not split it
        [[ "$cur" == ?*=* ]] && COMPREPLY=("${COMPREPLY[@]/#/$key=}")
        return
    fi
    local k list=""
    for k in $_lokictl_keys; do
        if [ "$1" = set ] && [ "$k" != env. ]; then list+="$k= "; else list+="$k "; fi
    done
    COMPREPLY=($(compgen -W "$list" -- "$cur"))
    if [ "$1" = set ] || [[ ${#COMPREPLY[@]} -eq 1 && "${COMPREPLY[0]}" == *. ]]; then
        compopt -o nospace 2>/dev/null
    fi
}

_lokictl() {
    local cur prev words cword
    _lokid_init
    local i cmd=""
    for ((i = 1; i < cword; i++)); do
        case "${words[i]}" in
            status|presets|devices|show|plan|start|stop|restart|unload|reload|clear-failures|bench|top|stats|logs|\
            new|set|unset|rm|mv|cat|edit|keys|usage|replica|pull|pulls) cmd="${words[i]}"; break ;;
        esac
    done
    case "$prev" in
        --bus) COMPREPLY=($(compgen -W "system session" -- "$cur")); return ;;
        -H|--host|--hosts) COMPREPLY=($(compgen -A hostname -- "$cur")); return ;;
        --model) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        --dir) COMPREPLY=($(compgen -d -- "$cur")); return ;;
        --cancel) COMPREPLY=($(compgen -W "$(systemctl list-units --plain --no-legend 'loki-pull-*' 2>/dev/null | cut -d' ' -f1)" -- "$cur")); return ;;
        --timeout|--address|--predict|--prompt|--repeat|--since|-n|--lines) return ;;
        --by) COMPREPLY=($(compgen -W "key preset day" -- "$cur")); return ;;
        --key|--until) return ;;
        --preset) COMPREPLY=($(compgen -W "$(_lokid_presets)" -- "$cur")); return ;;
        --class) COMPREPLY=($(compgen -W "interactive batch" -- "$cur")); return ;;
        --models|--max-in-flight|--rpm|--tpm|--tokens-per-day|--tokens-per-month|--expires|--grace)
            return ;;
    esac
    # n: the words after the verb that are not options (0: the cursor is on the preset)
    local j n=0
    for ((j = i + 1; j < cword; j++)); do
        case "${words[j]}" in -*) ;; *) n=$((n + 1)) ;; esac
    done
    local verbs="status presets devices top stats logs show plan start stop restart unload reload clear-failures bench
new set unset rm mv cat edit keys usage replica pull pulls"
    case "$cmd" in
        "") COMPREPLY=($(compgen -W "$verbs --bus --address --host --hosts --help" -- "$cur")) ;;
        status|presets|devices) COMPREPLY=($(compgen -W "--json" -- "$cur")) ;;
        show|plan) COMPREPLY=($(compgen -W "$(_lokid_presets) --json" -- "$cur")) ;;
        start|stop|restart) COMPREPLY=($(compgen -W "$(_lokid_presets) --wait --timeout" -- "$cur")) ;;
        unload) COMPREPLY=($(compgen -W "$(_lokid_presets) --timeout" -- "$cur")) ;;
        clear-failures) COMPREPLY=($(compgen -W "$(_lokid_presets)" -- "$cur")) ;;
        bench) COMPREPLY=($(compgen -W "$(_lokid_presets) --full --predict --prompt --repeat --json" -- "$cur")) ;;
        pull) COMPREPLY=($(compgen -W "--dir --json --no-wait --cancel" -- "$cur")) ;;
        pulls) COMPREPLY=($(compgen -W "--json" -- "$cur")) ;;
        top) COMPREPLY=($(compgen -W "--once --json" -- "$cur")) ;;
        usage) COMPREPLY=($(compgen -W "--by --key --preset --since --until --json" -- "$cur")) ;;
        stats) COMPREPLY=($(compgen -W "$(_lokid_presets) --since --json" -- "$cur")) ;;
        logs) COMPREPLY=($(compgen -W "$(_lokid_presets) -n --follow" -- "$cur")) ;;
        cat|edit) [ $n -eq 0 ] && COMPREPLY=($(compgen -W "$(_lokid_presets)" -- "$cur")) ;;
        rm) [ $n -eq 0 ] && COMPREPLY=($(compgen -W "$(_lokid_presets) --force" -- "$cur")) \
                || COMPREPLY=($(compgen -W "--force" -- "$cur")) ;;
        mv) [ $n -eq 0 ] && COMPREPLY=($(compgen -W "$(_lokid_presets) --force" -- "$cur")) \
                || COMPREPLY=($(compgen -W "--force" -- "$cur")) ;;
        set|unset)
            if [ $n -eq 0 ]; then
                COMPREPLY=($(compgen -W "$(_lokid_presets)" -- "$cur"))
            else
                _lokictl_key "$cmd"
            fi ;;
        keys)   # lokictl keys VERB NAME [options]: the gateway's client keys
            local kverb="" k
            for ((k = i + 1; k < cword; k++)); do
                case "${words[k]}" in add|list|change|revoke|rotate|remove) kverb="${words[k]}"; break ;; esac
            done
            case "$kverb" in
                "") COMPREPLY=($(compgen -W "add list change revoke rotate remove" -- "$cur")) ;;
                add|change) [[ "$cur" == -* ]] && COMPREPLY=($(compgen -W "--models --class
--max-in-flight --rpm --tpm --tokens-per-day --tokens-per-month --expires" -- "$cur")) ;;
                list) COMPREPLY=($(compgen -W "--json" -- "$cur")) ;;
                rotate) [[ "$cur" == -* ]] && COMPREPLY=($(compgen -W "--grace" -- "$cur")) ;;
            esac ;;
        replica)   # lokictl replica VERB PRESET [INDEX]: a preset's replicas (issue 47)
            local rverb="" r
            for ((r = i + 1; r < cword; r++)); do
                case "${words[r]}" in list|start|stop) rverb="${words[r]}"; break ;; esac
            done
            case "$rverb" in
                "") COMPREPLY=($(compgen -W "list start stop" -- "$cur")) ;;
                *) [ $n -eq 1 ] && COMPREPLY=($(compgen -W "$(_lokid_presets)" -- "$cur")) ;;
            esac ;;
        new)
            if [[ "$cur" == -* ]]; then
                COMPREPLY=($(compgen -W "--model" -- "$cur"))
            elif [ $n -gt 0 ]; then
                _lokictl_key set
            fi ;;
    esac
}

complete -F _lokid lokid
complete -F _lokictl lokictl
