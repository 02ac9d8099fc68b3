//! The `test` condition: grammar, variables, operators and parse errors.

use super::*;

fn http(s: &str) -> Condition {
    Condition::parse(s, Scope::Http).unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

fn headers(list: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
    list.iter()
        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
        .collect()
}

/// A 200 response with `Content-Type: application/json`, `X-Role: primary` twice
/// (`primary`, `ro`) and body `{"ok":true}`.
fn check(cond: &str) -> bool {
    let h = headers(&[
        ("content-type", "application/json"),
        ("x-role", "primary"),
        ("x-role", "ro"),
    ]);
    http(cond).holds(&Response {
        status: Some(200),
        headers: &h,
        body: br#"{"ok":true}"#,
    })
}

#[test]
fn status_compares_as_text_and_matches_as_regex() {
    assert!(check("$upstream_status == 200"));
    assert!(check("$upstream_status = \"200\""));
    assert!(!check("$upstream_status == 204"));
    assert!(check("$upstream_status != 204"));
    assert!(check("$upstream_status ~ ^2"));
    assert!(!check("$upstream_status ~ \"^(4|5)\""));
}

#[test]
fn headers_by_name_any_case_dashes_as_underscores_repeats_joined() {
    assert!(check("$upstream_http_content_type ~ json"));
    assert!(
        check("$upstream_http_Content_Type ~ json"),
        "header names ignore case"
    );
    assert!(check("$upstream_http_x_role == \"primary, ro\""));
    assert!(
        !check("$upstream_http_x_missing"),
        "an absent header is empty"
    );
    assert!(check("!$upstream_http_x_missing"));
    assert!(
        check("$upstream_http_content_type ~* JSON"),
        "~* ignores case"
    );
    assert!(!check("$upstream_http_content_type ~ JSON"), "~ does not");
}

#[test]
fn body_matches_and_negations() {
    assert!(check("$upstream_probe_response ~ \"\\\"ok\\\":true\""));
    assert!(check("$upstream_probe_response !~ error"));
    assert!(!check("$upstream_probe_response !~ ok"));
    assert!(check("$upstream_probe_response !~* ERROR"));
    assert!(!check("!($upstream_status == 200)"));
    assert!(check("!!$upstream_status"));
}

#[test]
fn and_binds_tighter_than_or_and_parentheses_group() {
    // false && true || true = true; false && (true || true) = false.
    assert!(check(
        "$upstream_status == 500 && $upstream_probe_response ~ ok || $upstream_http_x_role ~ ro"
    ));
    assert!(!check(
        "$upstream_status == 500 && ($upstream_probe_response ~ ok || $upstream_http_x_role ~ ro)"
    ));
    assert!(check(
        "($upstream_status == 503 || $upstream_status == 200) && $upstream_http_content_type ~ json"
    ));
    assert!(!check(
        "$upstream_status == 200 && $upstream_http_content_type ~ xml"
    ));
}

#[test]
fn a_bare_variable_holds_unless_empty_or_zero_as_in_angie() {
    let stream = |cond: &str, body: &[u8]| {
        Condition::parse(cond, Scope::Stream)
            .unwrap()
            .holds(&Response {
                body,
                ..Response::default()
            })
    };
    assert!(stream("$upstream_probe_response", b"PONG"));
    assert!(!stream("$upstream_probe_response", b""));
    assert!(!stream("$upstream_probe_response", b"0"));
    assert!(stream("$upstream_probe_response", b"00"));
    assert!(stream(
        "$upstream_probe_response ~ \"^\\\\+PONG\"",
        b"+PONG\r\n"
    ));
}

#[test]
fn parse_errors_name_the_column_and_what_is_allowed() {
    let err = |s: &str, scope| Condition::parse(s, scope).unwrap_err().to_string();
    assert_eq!(
        err("$upstream_status == 200 &&", Scope::Http),
        "at column 27: expected a variable such as $upstream_status, `!` or `(`, found the end"
    );
    assert!(
        err("$status == 200", Scope::Http).starts_with(
            "at column 1: unknown variable $status; this probe type has $upstream_status,"
        ),
        "{}",
        err("$status == 200", Scope::Http)
    );
    assert!(err("$upstream_status == 200", Scope::Stream).contains("is an http variable"));
    assert!(err("$upstream_http_server", Scope::Stream).contains("is an http variable"));
    assert!(err("($upstream_status", Scope::Http).contains("expected `)`, found the end"));
    assert!(
        err("$upstream_status 200", Scope::Http)
            .contains("at column 18: expected `&&`, `||` or the end")
    );
    assert!(
        err("$upstream_status ~ \"(\"", Scope::Http)
            .contains("at column 20: \"(\" is not a valid regular expression")
    );
    assert!(err("$upstream_status == \"200", Scope::Http).contains("not closed"));
    assert!(err("$upstream_status ~ \"\\d\"", Scope::Http).contains("only \\\" and \\\\"));
    assert!(err("$upstream_status == &&", Scope::Http).contains("expected a value"));
    assert!(err("$upstream_status & 1", Scope::Http).contains("a single `&`: write `&&`"));
    assert!(err("", Scope::Http).contains("found the end"));
    assert!(err("$upstream_http_", Scope::Http).contains("needs a header name"));
}

#[test]
fn conditions_compare_by_their_text() {
    assert_eq!(
        http("$upstream_status == 200"),
        http("$upstream_status == 200")
    );
    assert_ne!(
        http("$upstream_status == 200"),
        http("$upstream_status == 201")
    );
    assert_eq!(
        http("$upstream_status ~ ^2").to_string(),
        "$upstream_status ~ ^2"
    );
}

/// Conditions that could never do what they say, and slips from other syntaxes, are
/// refused with the fix in the message.
#[test]
fn mistakes_get_a_hint() {
    let err = |s: &str| Condition::parse(s, Scope::Http).unwrap_err().to_string();
    assert_eq!(
        err("$upstream_status == 2xx"),
        "at column 21: $upstream_status is a three-digit code such as 200: `== 2xx` never \
         holds; for a class of codes match it, e.g. $upstream_status ~ ^2"
    );
    assert!(
        err("$upstream_status != 5xx").contains("`!= 5xx` always holds")
            && err("$upstream_status != 5xx").contains("$upstream_status !~ ^5"),
        "{}",
        err("$upstream_status != 5xx")
    );
    assert!(err("$upstream_status == ok").contains("never holds"));
    assert_eq!(
        err("$upstream_http_X-Foo ~ ok"),
        "at column 1: `$upstream_http_X-Foo`: a header variable writes `-` as `_` (and any \
         case as lower case): write $upstream_http_x_foo"
    );
    assert_eq!(
        err("$upstream_status ~ ^2 & $upstream_http_x_a"),
        "at column 23: a single `&`: write `&&` for \"both\""
    );
    assert!(
        err("$upstream_status ~ 200|204")
            .contains("quote a value with `|` in it, e.g. ~ \"^(200|204)$\""),
        "{}",
        err("$upstream_status ~ 200|204")
    );
    assert!(err("$upstream_status | $upstream_http_a").contains("write `||` for \"either\""));
    let hint = err("$upstream_status ~ ^(2|3)..$");
    assert!(
        hint.contains("e.g. ~ \"^(2|3)..$\""),
        "the hint quotes the value as written, which matches a three-digit code: {hint}"
    );
    assert!(
        err("($upstream_status ~ 200|204)").contains("~ \"^(200|204)$\""),
        "the condition's own `)` is not part of the value"
    );
    // A status regex that matches no code from 100 to 599.
    assert!(err("$upstream_status ~ 2xx").contains("\"2xx\" matches no status code"));
    assert!(err("$upstream_status ~ \"^(2|3)$\"").contains("never holds"));
    assert!(err("$upstream_status !~ ^6").contains("always holds"));
    // What stays valid.
    assert!(check("$upstream_status ~ \"^(2|3)..$\""));
    assert!(check("$upstream_status ~ \"^(200|204)$\""));
    assert!(check("$upstream_status == 200 || $upstream_status == 204"));
    assert!(http("$upstream_probe_response ~ ok").reads_response());
    assert!(!http("$upstream_status ~ ^2 && !$upstream_http_x").reads_response());
}
