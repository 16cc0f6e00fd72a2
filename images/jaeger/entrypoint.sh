#!/bin/sh
# Jaeger with the UI build in /cmd/jaeger/ui where scripts/images.sh put one; else as is (a
# release binary's UI is inside), after the one line images.sh left to say why there is none.
ui=/cmd/jaeger/ui
if [ -f "$ui/index.html" ]; then
    exec /cmd/jaeger/jaeger-linux "--set=extensions.jaeger_query.ui.assets_path=$ui" "$@"
fi
if [ -f "$ui/none" ]; then
    echo "jaeger: no UI: $(cat "$ui/none")" >&2
fi
exec /cmd/jaeger/jaeger-linux "$@"
