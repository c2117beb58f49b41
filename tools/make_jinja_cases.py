#!/usr/bin/env python3
"""Expected outputs of small Jinja templates, one per interpreter feature, from real Jinja2 in the environment
transformers renders chat templates with. Writes tests/fixtures/chat/jinja_cases.json, which
tests/tokenizer/jinja_conformance_test.cpp checks the C++ interpreter against byte for byte.

    python3 tools/make_jinja_cases.py        (needs jinja2 only)
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

CASES = [
    # --- text and whitespace control (trim_blocks, lstrip_blocks, -, +) ---
    ("plain_text", "Hello, world!", {}),
    ("trailing_newline_dropped", "line\n", {}),
    ("two_trailing_newlines", "line\n\n", {}),
    ("crlf_normalized", "a\r\nb\rc", {}),
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter", {}),
    ("lstrip_blocks", "start\n    {% if true %}\n    body\n    {% endif %}\nend", {}),
    ("lstrip_not_for_variables", "  {{ 'x' }}\n  {% if true %}y{% endif %}", {}),
    ("lstrip_mid_line_untouched", "a  {% if true %}b{% endif %}  c", {}),
    ("minus_strips_newlines", "a\n\n  {%- if true -%}\n\n  b  \n{%- endif %}\nc", {}),
    ("minus_on_variables", "a  {{- 'b' -}}  c", {}),
    ("plus_disables_lstrip", "x\n    {%+ if true %}y{% endif %}", {}),
    ("plus_disables_trim", "{% if true +%}\ny{% endif %}", {}),
    ("comment_removed", "a{# comment #}b\n{# line comment #}\nc", {}),
    ("comment_minus", "a   {#- c -#}   b", {}),
    ("raw_block", "{% raw %}{{ not rendered }}{% if %}{% endraw %}", {}),
    ("raw_block_whitespace", "x\n  {% raw -%}  \n {{ a }} \n  {%- endraw %}\ny", {}),
    ("block_at_line_start_after_block", "{% for i in [1, 2] %}\n  {% if i %}\n{{ i }}\n  {% endif %}\n{% endfor %}\n", {}),
    # --- literals and printing ---
    ("print_types", "{{ 1 }}|{{ 1.5 }}|{{ 2.0 }}|{{ true }}|{{ false }}|{{ none }}|{{ 'str' }}|{{ True }}|{{ None }}", {}),
    ("print_list_repr", "{{ [1, 'a', none, true, 2.5, [\"x'y\"], {'k': 'v'}] }}", {}),
    ("print_dict_repr", "{{ {'a': 1, 'b': [1, 2], 'c': {'d': none}} }}", {}),
    ("print_string_repr_escapes", "{{ ['tab\\there', 'new\\nline', 'quote\\'s', 'both\\'\"', 'back\\\\slash', 'é'] }}", {}),
    ("print_floats", "{{ 0.1 + 0.2 }}|{{ 1e20 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 0.0001 }}|{{ 0.00001 }}|{{ 3.0 * 2 }}|{{ -0.0 }}|{{ 10 / 4 }}|{{ 7 / 7 }}", {}),
    ("print_undefined", "[{{ missing }}]", {}),
    ("string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\\x41\\u00e9' }}|{{ \"dq\\\"\" }}", {}),
    ("adjacent_strings", "{{ 'a' 'b' \"c\" }}", {}),
    ("numbers_with_underscores", "{{ 1_000 + 1 }}", {}),
    # --- operators ---
    ("arithmetic", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }}", {}),
    ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 2 * 3 ~ 4 }} {{ 'a' ~ 2 * 3 }} {{ 2 ** 3 ** 2 }} {{ 10 - 2 - 3 }}", {}),
    ("concat_binds_tighter_than_plus_error", "{{ 1 + 1 ~ 1 }}", {}),
    ("string_ops", "{{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ 3 * 'x' }} {{ 'n' ~ 1 ~ none ~ true }} {{ [1] + [2] }} {{ [0] * 2 }}", {}),
    ("comparisons", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }} {{ [1, 2] == [1, 2] }} {{ none == none }} {{ [1, 2] < [1, 3] }}", {}),
    ("in_operator", "{{ 'a' in 'cat' }} {{ 'z' not in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'v' in {'k': 'v'} }} {{ 'x' in missing }}", {}),
    ("logic", "{{ true and 'yes' }} {{ false or 'fallback' }} {{ 0 or '' or none }} {{ not 0 }} {{ not 'a' }} {{ [] and 1 }}", {}),
    ("not_binds_looser_than_is", "{{ not x is defined }} {{ not none is none }}", {"x": 1}),
    ("ternary", "{{ 'y' if 1 else 'n' }} {{ 'y' if 0 else 'n' }} [{{ 'y' if 0 }}] {{ 'a' if false else 'b' if true else 'c' }}", {}),
    ("truthiness", "{% for v in [0, 1, '', 'a', [], [0], {}, {'a': 1}, none, 0.0] %}{{ 'T' if v else 'F' }}{% endfor %}", {}),
    # --- subscripts, attributes, slices ---
    ("subscripts", "{{ xs[0] }} {{ xs[-1] }} {{ d['k'] }} {{ d.k }} {{ xs.1 }} [{{ xs[10] }}] [{{ d.nope }}] {{ s[1] }} {{ s[-1] }}", {"xs": [1, 2, 3], "d": {"k": "v"}, "s": "héllo"}),
    ("slices", "{{ xs[1:] }} {{ xs[:2] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[-2:] }} {{ xs[1:-1] }} {{ xs[5:] }} {{ s[::-1] }} {{ s[1:3] }} {{ s[-3:] }}", {"xs": [1, 2, 3, 4], "s": "日本語テキスト"}),
    ("nested_access", "{{ m[0].tool_calls[0].function.name }} {{ m[0]['tool_calls'][0]['function']['arguments'] }}", {"m": [{"tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}]}),
    ("dict_attr_vs_method", "{{ d.items is defined }} {{ d['items'] }} {{ d.get('k') }} {{ d.get('missing') }} {{ d.get('missing', 'dflt') }}", {"d": {"items": "key named items", "k": "v"}}),
    # --- tests ---
    ("tests_types", "{% for v in [1, 1.5, 'a', [1], {'a': 1}, none, true] %}{{ v is number }}{{ v is string }}{{ v is mapping }}{{ v is iterable }}{{ v is sequence }}{{ v is none }}{{ v is boolean }}{{ v is integer }}{{ v is float }};{% endfor %}", {}),
    ("tests_defined", "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ d.a is defined }} {{ d.b is defined }} {{ n is defined }} {{ n is none }} {{ n is not none }}", {"x": 1, "d": {"a": 1}, "n": None}),
    ("tests_values", "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 2 is eq 2 }} {{ 'a' is in 'abc' }} {{ x is sameas false }} {{ 'abc' is lower }}", {"x": False}),
    ("enable_thinking_pattern", "{% if enable_thinking is defined and enable_thinking is false %}off{% else %}on{% endif %}", {"enable_thinking": False}),
    ("content_is_string", "{% for m in ms %}{{ m.content is string }}{% endfor %}", {"ms": [{"content": "a"}, {"content": [{"type": "text", "text": "b"}]}, {"content": None}]}),
    # --- if / for ---
    ("if_elif_else", "{% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %} {% endfor %}", {}),
    ("loop_variables", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", {}),
    ("loop_prev_next", "{% for x in [1, 2, 3] %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}", {}),
    ("loop_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %}", {}),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}{% for x in [1] %}x{% else %}empty{% endfor %}", {}),
    ("for_filter_clause", "{% for x in range(10) if x is odd %}{{ x }}{{ ',' if not loop.last }}{% endfor %} {% for m in ms if m.role != 'system' %}{{ loop.index }}{{ m.role }}{% endfor %}", {"ms": [{"role": "system"}, {"role": "user"}, {"role": "assistant"}]}),
    ("for_filters_in_iterable", "{% for x in xs | reverse | list %}{{ x }}{% endfor %} {% for m in ms | selectattr('role', 'equalto', 'user') %}{{ m.content }}{% endfor %}", {"xs": [1, 2, 3], "ms": [{"role": "user", "content": "u1"}, {"role": "bot", "content": "b"}, {"role": "user", "content": "u2"}]}),
    ("for_unpacking", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}{% for (a, b) in [(5, 6)] %}{{ a * b }}{% endfor %}", {"d": {"x": 1, "y": [2]}}),
    ("for_over_dict_and_string", "{% for k in d %}{{ k }}{% endfor %}|{% for c in 'héllo' %}{{ c }}.{% endfor %}|{% for x in missing %}never{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("nested_loops", "{% for i in range(2) %}{% for j in range(2) %}{{ i }}{{ j }}{{ loop.index }}/{% endfor %}{{ loop.index }} {% endfor %}", {}),
    ("break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("loop_scope", "{% set x = 'outer' %}{% for i in [1] %}{% set x = 'inner' %}{{ x }}{% endfor %} {{ x }}", {}),
    ("loop_scope_per_iteration", "{% set s = 'ab' %}{% for i in range(3) %}{% set s = s ~ s %}{{ s }},{% endfor %}{{ s }}|{% for i in range(3) %}[{{ y }}]{% set y = i %}{% endfor %}", {"y": "o"}),
    ("if_does_not_scope", "{% if true %}{% set x = 1 %}{% endif %}{{ x }}", {}),
    # --- set / namespace / macro / call / filter blocks ---
    ("set_forms", "{% set a = 1 %}{% set b, c = [2, 3] %}{% set t = 4, 5 %}{{ a }}{{ b }}{{ c }}{{ t }}", {}),
    ("set_block", "{% set block %}  inner {{ 1 + 1 }}\n{% endset %}[{{ block }}]{% set up | upper %}shout{% endset %}{{ up }}", {}),
    ("namespace", "{% set ns = namespace(count=0, found=false) %}{% for i in range(3) %}{% set ns.count = ns.count + i %}{% if i == 1 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}", {}),
    ("namespace_qwen_pattern", "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}{%- if ns.multi_step_tool and message.role == 'user' %}{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}{{ ns.last_query_index }}", {"messages": [{"role": "user"}, {"role": "assistant"}, {"role": "user"}, {"role": "tool"}]}),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(name='C', punct='.') }}", {}),
    ("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}", {}),
    ("macro_sees_globals", "{% macro show() %}{{ bos_token }}{% endmacro %}{{ show() }}", {"bos_token": "<s>"}),
    ("macro_whitespace", "{% macro render_tool(t) %}\n  - {{ t.name }}\n{% endmacro %}\n{% for t in tools %}\n{{ render_tool(t) }}\n{% endfor %}", {"tools": [{"name": "a"}, {"name": "b"}]}),
    ("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ 1 }}{% endcall %}", {}),
    ("call_block_args", "{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(item) each([1, 2]) %}[{{ item }}]{% endcall %}", {}),
    ("filter_block", "{% filter upper %}shout {{ 'this' }}{% endfilter %}", {}),
    ("generation_tag", "{% for m in ms %}{% generation %}{{ m }}{% endgeneration %}{% endfor %}", {"ms": ["a", "b"]}),
    # --- filters ---
    ("tojson_basic", "{{ d | tojson }}", {"d": {"name": "f", "n": 1, "f": 0.5, "b": True, "z": None, "l": [1, "two", {"x": []}], "u": "日本 é 🙂", "q": "a\"b\\c\n\t\u0001<>&'"}}),
    ("tojson_indent", "{{ d | tojson(indent=2) }}|{{ [] | tojson(indent=4) }}|{{ {} | tojson(indent=4) }}|{{ [1, [2]] | tojson(indent=1) }}", {"d": {"a": [1, {"b": None}], "c": "x"}}),
    ("tojson_options", "{{ d | tojson(sort_keys=true) }}|{{ d | tojson(separators=(',', ':')) }}|{{ 'é' | tojson(ensure_ascii=true) }}", {"d": {"b": 1, "a": [1, 2]}}),
    ("tojson_scalars", "{{ 'x' | tojson }} {{ 1 | tojson }} {{ 1.0 | tojson }} {{ none | tojson }} {{ true | tojson }} {{ 1e100 | tojson }}", {}),
    ("trim_length_join", "[{{ '  a b \n' | trim }}] {{ 'xxhixx' | trim('x') }} {{ 'héllo' | length }} {{ [1, 2] | count }} {{ {'a': 1} | length }} {{ [1, 2, 3] | join(', ') }} {{ ['a', 'b'] | join }} {{ ms | join('/', attribute='r') }}", {"ms": [{"r": "x"}, {"r": "y"}]}),
    ("default_filter", "{{ missing | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ none | d('n') }} {{ 0 | default(5, boolean=true) }} {{ x | default('unused') }}", {"x": "set"}),
    ("first_last", "{{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'abc' | first }} {{ 'abc' | last }} [{{ [] | first }}]", {}),
    ("map_filter", "{{ ms | map(attribute='role') | list }} {{ ['a', 'b'] | map('upper') | join }} {{ ms | map(attribute='x', default='?') | list }} {{ [' a ', 'b '] | map('trim') | list }}", {"ms": [{"role": "user"}, {"role": "assistant", "x": 1}]}),
    ("select_reject", "{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('odd') | list }} {{ [0, 1, '', 'a'] | select | list }} {{ [1, 5, 10] | select('gt', 3) | list }}", {}),
    ("selectattr_rejectattr", "{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='c') | list }} {{ ms | rejectattr('role', 'eq', 'user') | list | length }} {{ ms | selectattr('tool') | list | length }}", {"ms": [{"role": "user", "c": 1}, {"role": "tool", "c": 2, "tool": True}, {"role": "user", "c": 3}]}),
    ("conversions", "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 1 | float }} {{ 'x' | float }} {{ 12 | string }} {{ [1] | string }} {{ 'ab' | list }} {{ d | list }} {{ true | int }}", {"d": {"k": 1, "j": 2}}),
    ("string_filters", "{{ 'hello WORLD' | capitalize }} {{ 'Hi' | upper }} {{ 'Hi' | lower }} {{ 'hello big-world (x)' | title }} {{ 'aaa' | replace('a', 'b') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ '<&>' | safe }} {{ '<a href=\"x\">' | e }}", {}),
    ("indent_filter", "[{{ 'a\nb\n\nc' | indent }}] [{{ 'a\nb' | indent(2, true) }}] [{{ 'a\n\nb' | indent(2, blank=true) }}] [{{ 'a\nb' | indent('> ') }}]", {}),
    ("numeric_filters", "{{ -3 | abs }} {{ -2.5 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(method='floor') }} {{ [1, 2, 3] | sum }} {{ [3, 1, 2] | max }} {{ [3, 1, 2] | min }}", {}),
    ("collection_filters", "{{ [3, 1, 2] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ ['b', 'A', 'c'] | sort }} {{ ms | sort(attribute='n') | map(attribute='n') | list }} {{ [1, 2, 1, 3] | unique | list }} {{ d | items | list }} {{ d | dictsort }} {{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }}", {"ms": [{"n": 2}, {"n": 1}], "d": {"b": 1, "a": 2}}),
    ("misc_filters", "{{ 'a b  c' | wordcount }} {{ '%s-%d' | format('x', 3) }} {{ 'abc' | center(9) }}|", {}),
    # --- methods ---
    ("string_methods", "{{ s.startswith('He') }} {{ s.endswith('!') }} {{ s.startswith(('x', 'H')) }} {{ s.split(' ') }} {{ s.split() }} {{ '  a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ s.upper() }} {{ s.lower() }} {{ 'hello world'.title() }} {{ 'abc'.capitalize() }} {{ s.replace('l', 'L') }} {{ s.replace('l', 'L', 1) }} {{ s.find('o') }} {{ s.count('l') }}", {"s": "Hello World!"}),
    ("strip_methods", "[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ '\n\nx\n'.strip('\n') }}][{{ 'xxyxx'.lstrip('x') }}][{{ 'xxyxx'.rstrip('x') }}][{{ '\u3000wide\u3000'.strip() }}]", {"s": " \t pad \n"}),
    ("think_split_pattern", "{% set c = m.content %}{{ c.split('</think>')[-1].lstrip('\n') }}|{{ c.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') }}", {"m": {"content": "<think>\nreason\n</think>\n\nanswer"}}),
    ("format_method", "{{ '{} and {}'.format('a', 'b') }} {{ '{0}{0}'.format('x') }} {{ '{name}!'.format(name='n') }} {{ '{{literal}}'.format() }}", {}),
    ("join_method", "{{ ', '.join(['a', 'b']) }} {{ ''.join(xs) }}", {"xs": ["x", "y"]}),
    ("dict_methods", "{{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }} {% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}", {"d": {"z": 1, "a": 2}}),
    ("list_methods", "{{ xs.index(2) }} {{ xs.count(1) }}", {"xs": [1, 2, 1]}),
    ("is_methods", "{{ '123'.isdigit() }} {{ '12a'.isdigit() }} {{ 'ab'.isalpha() }} {{ '  '.isspace() }} {{ 'AB'.isupper() }} {{ 'ab'.islower() }}", {}),
    # --- globals ---
    ("range_global", "{{ range(3) | list }} {{ range(1, 4) | list }} {{ range(10, 0, -3) | list }} {{ range(0) | list }}", {}),
    ("dict_global", "{{ dict(a=1, b='x') }} {{ dict(a=1).a }}", {}),
    ("raise_exception", "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with a user message') }}{% endif %}ok", {"messages": [{"role": "system"}]}),
    # --- assorted Python semantics ---
    ("chained_comparisons", "{{ 1 < 2 < 3 }} {{ 3 > 2 > 1 }} {{ 1 < 3 < 2 }} {{ 1 == 1 != 2 }}", {}),
    ("none_attribute_is_undefined", "[{{ n.attr }}][{{ n.attr is defined }}][{{ 'abc'[5] }}][{{ [1, 2, 3][1:2][0] }}]", {"n": None}),
    ("dict_as_sequence", "{{ d | length }} {{ d | first }} {{ d | list }} {{ d.items() | list | first }} {{ d | dictsort | first }}", {"d": {"b": 1, "a": 2}}),
    ("select_with_in_test", "{{ ms | selectattr('role', 'in', ['user', 'system']) | map(attribute='role') | join(',') }}", {"ms": [{"role": "system"}, {"role": "tool"}, {"role": "user"}]}),
    ("percent_format", "{{ '%.2f' | format(3.14159) }} {{ '%5s|%-5s|' | format('a', 'b') }} {{ '%03d %x %%' | format(7, 255) }} {{ 'v=%s' % 5 }} {{ '%s and %s' % ('a', 'b') }}", {}),
    ("unicode_case", "{{ 'ÄÖÜ Straße ΑΒΓ Привет' | lower }} {{ 'äöü αβγ привет' | upper }} {{ 'élan vital' | title }} {{ 'éLAN' | capitalize }}", {}),
    ("power_and_float_repr", "{{ 2 ** 0.5 }} {{ 10 // 3.0 }} {{ 1 / 3 }} {{ 2 ** 62 }} {{ 1e-7 }} {{ 123456789.125 }} {{ 0.1 * 3 }}", {}),
    ("macro_default_refers_to_param", "{% macro f(a, b=a ~ '!') %}{{ a }}{{ b }}{% endmacro %}{{ f('x') }} {{ f('x', 'y') }}", {}),
    ("string_with_delimiters", "{{ '}}' }}{{ \"{%\" }}{# {{ ignored }} #}{ lone brace }", {}),
    ("loop_in_macro_with_outer_loop", "{% macro m(xs) %}{% for x in xs %}{{ loop.index }}{% endfor %}{% endmacro %}{% for i in [1, 2] %}{{ loop.index }}:{{ m([7, 8]) }};{% endfor %}", {}),
    ("set_in_if_in_loop", "{% for i in range(3) %}{% if i == 1 %}{% set found = i %}{% endif %}{{ found is defined }}{% endfor %}", {}),
    ("filter_chain_precedence", "{{ -3 | abs }} {{ 'a' ~ 'b' | upper }} {{ [3, 1] | sort | first + 1 }} {{ not [] | length }}", {}),
    ("tojson_nested_unicode_and_floats", "{{ v | tojson }}", {"v": {"f": [1.5, 2.0, 1e-07, 1e+22, -0.0, 100000000000000000000.0], "s": "\u2028\u00ad\u200b\ufeff", "e": {}}}),
    ("repr_of_unicode", "{{ ['\u00e9', '\u200b', '\x7f', '\u3000', 'tab\t'] }}", {}),
    # --- found by differential fuzzing against Jinja2 ---
    ("raw_endraw_plus_keeps_indent", "{% raw %}{{ r }}x\n  {%+ endraw %}|{% raw %}a\n  {% endraw %}|", {}),
    ("undefined_is_callable_and_sequence", "{{ missing is callable }} {{ missing is sequence }} {{ missing is iterable }}", {}),
    ("tuple_vs_list_equality", "{{ (1, 2) == [1, 2] }} {{ (1, 2) == (1, 2) }} {{ (1,) + (2,) }} {{ (1, 2) * 2 }}", {}),
    ("round_keeps_ints", "{{ 3 | round }} {{ 3 | round(1, 'floor') }} {{ true | round }}", {}),
    ("odd_even_on_floats", "{{ 2.5 is odd }} {{ 3.0 is odd }} {{ 4.0 is even }}", {}),
    ("map_select_on_falsy", "{{ none | map('string') | list }} {{ 0 | select | list }} {{ '' | reject | list }}", {}),
    ("lower_upper_tests_on_non_strings", "{{ ['ab'] is lower }} {{ (1, 2) is lower }} {{ 'ABC1' is upper }} {{ '' is upper }}", {}),
    ("undefined_int_error", "{{ missing | int }}", {}),
    ("chained_tests_error", "{{ 1 is number is true }}", {}),
    ("percent_unused_argument_error", "{{ 'no specifiers' % 5 }}", {}),
    ("raw_plus_close_is_unknown_tag_error", "{% raw +%}x{% endraw %}", {}),
    # --- undefined semantics and errors (expected to fail as Jinja2 does) ---
    ("undefined_attribute_error", "{{ missing.attr }}", {}),
    ("undefined_add_error", "{{ 'a' + missing }}", {}),
    ("undefined_item_chained_ok", "[{{ d.nope }}][{{ d.nope is defined }}][{{ d.nope | default('x') }}][{{ d.nope | length }}][{{ d.nope | trim }}]", {"d": {}}),
    ("undefined_iteration_and_in", "{% for x in d.nope %}x{% endfor %}{{ 'a' in d.nope }}{{ d.nope == d.other }}", {"d": {}}),
    ("none_concat_error", "{{ 'a' + none }}", {}),
    ("none_in_error", "{{ 'a' in none }}", {}),
    ("str_plus_int_error", "{{ 'a' + 1 }}", {}),
    ("dict_plus_str_error", "{{ 'a' + d }}", {"d": {"k": 1}}),
    ("unknown_filter_error", "{{ 1 | nonexistent_filter }}", {}),
    ("unknown_test_error", "{{ 1 is nonexistent_test }}", {}),
    ("call_undefined_error", "{{ nothing() }}", {}),
    ("division_by_zero_error", "{{ 1 / 0 }}", {}),
    ("tojson_undefined_error", "{{ missing | tojson }}", {}),
    ("set_attribute_on_dict_error", "{% set d = {} %}{% set d.x = 1 %}", {}),
    ("list_append_unsafe_error", "{% set xs = [] %}{{ xs.append(1) }}", {}),
    ("syntax_error_unclosed_if", "{% if true %}never closed", {}),
    ("syntax_error_bad_expression", "{{ 1 + }}", {}),
    ("syntax_error_unknown_tag", "{% frobnicate %}", {}),
]


def main():
    import jinja2  # noqa: F401
    from make_chat_refs import Jinja2Renderer  # same environment as the chat references

    env = Jinja2Renderer.environment()
    cases = []
    for name, source, context in CASES:
        case = {"name": name, "template": source, "context": context}
        try:
            case["expected"] = env.from_string(source).render(**context)
        except Exception as error:  # noqa: BLE001 - expected failures are part of the fixture
            case["error"] = f"{type(error).__name__}: {error}"
        cases.append(case)
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "chat", "jinja_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"source": f"jinja2 {jinja2.__version__}, transformers' chat-template environment",
                   "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{path}: {len(cases)} cases, {sum('error' in c for c in cases)} expected errors")


if __name__ == "__main__":
    main()
