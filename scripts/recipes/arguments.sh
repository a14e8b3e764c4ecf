# What the recipes share for their arguments (sourced, not run): a stray argument or a setting that is not a number
# is one line naming it and exit 2, before any stage starts; the apps check the rest of a setting. A variable left
# unset or empty is not checked (the recipe's default stands).

refuse() {  # MESSAGE...: one line on stderr, exit 2
  echo "$(basename "$0"): error: $*" >&2
  exit 2
}

check_at_most() {  # N ARGS...: refuse more than N arguments
  local most=$1; shift
  [ "$#" -le "$most" ] || refuse "unexpected argument '${*:most+1:1}'; the usage is in $0's header"
}

check_whole() {  # NAME...: each variable a whole number (0 included)
  local name; for name; do
    [ -z "${!name:-}" ] || [[ ${!name} =~ ^[0-9]+$ ]] || refuse "$name=${!name} is not a whole number"
  done
}

check_count() {  # NAME...: each variable a whole number of at least 1
  local name; for name; do
    [ -z "${!name:-}" ] || [[ ${!name} =~ ^[0-9]*[1-9][0-9]*$ ]] \
      || refuse "$name=${!name} is not a whole number of at least 1"
  done
}

check_minutes() {  # NAME...: each variable a number of minutes above 0 (e.g. 4.5)
  local name; for name; do
    [ -z "${!name:-}" ] || [[ ${!name} =~ ^[0-9]*\.?[0-9]+$ && ! ${!name} =~ ^[0.]+$ ]] \
      || refuse "$name=${!name} is not a number of minutes above 0, e.g. 4.5"
  done
}
