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
    local commands="plan run bench prestart engine generate watch daemon"
    local i cmd=""
    for ((i = 1; i < cword; i++)); do
        case "${words[i]}" in
            plan|run|bench|prestart|engine|generate|watch|daemon) cmd="${words[i]}"; break ;;
        esac
    done
    case "$prev" in
        --config-dir) COMPREPLY=($(compgen -d -- "$cur")); return ;;
        --bus) COMPREPLY=($(compgen -W "system session" -- "$cur")); return ;;
        --runner) COMPREPLY=($(compgen -W "auto systemd local" -- "$cur")); return ;;
    esac
    case "$cmd" in
        "") COMPREPLY=($(compgen -W "$commands --config-dir --debug --version --help" -- "$cur")) ;;
        plan) COMPREPLY=($(compgen -W "$(_lokid_presets) --json" -- "$cur")) ;;
        run|prestart|engine) COMPREPLY=($(compgen -W "$(_lokid_presets)" -- "$cur")) ;;
        bench) COMPREPLY=($(compgen -W "$(_lokid_presets) --full --predict --prompt --json" -- "$cur")) ;;
        generate) COMPREPLY=($(compgen -d -- "$cur")) ;;
        daemon) COMPREPLY=($(compgen -W "--bus --bus-address --runner" -- "$cur")) ;;
    esac
}

_lokictl() {
    local cur prev words cword
    _lokid_init
    local i cmd=""
    for ((i = 1; i < cword; i++)); do
        case "${words[i]}" in
            status|presets|show|plan|start|stop|restart|reload|clear-failures|bench|top|stats) cmd="${words[i]}"; break ;;
        esac
    done
    case "$prev" in
        --bus) COMPREPLY=($(compgen -W "system session" -- "$cur")); return ;;
        -H|--host) COMPREPLY=($(compgen -A hostname -- "$cur")); return ;;
        --timeout|--address|--predict|--prompt|--since) return ;;
    esac
    local verbs="status presets top stats show plan start stop restart reload clear-failures bench"
    case "$cmd" in
        "") COMPREPLY=($(compgen -W "$verbs --bus --address --host --help" -- "$cur")) ;;
        status|presets) COMPREPLY=($(compgen -W "--json" -- "$cur")) ;;
        show|plan) COMPREPLY=($(compgen -W "$(_lokid_presets) --json" -- "$cur")) ;;
        start|stop|restart) COMPREPLY=($(compgen -W "$(_lokid_presets) --wait --timeout" -- "$cur")) ;;
        clear-failures) COMPREPLY=($(compgen -W "$(_lokid_presets)" -- "$cur")) ;;
        bench) COMPREPLY=($(compgen -W "$(_lokid_presets) --full --predict --prompt --json" -- "$cur")) ;;
        top) COMPREPLY=($(compgen -W "--once --json" -- "$cur")) ;;
        stats) COMPREPLY=($(compgen -W "$(_lokid_presets) --since --json" -- "$cur")) ;;
    esac
}

complete -F _lokid lokid
complete -F _lokictl lokictl
