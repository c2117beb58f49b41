// Errors of the Jinja interpreter: syntax errors while parsing and runtime errors while rendering.
// Every message names the template line, because a chat template is usually one long JSON string and
// "line N" is the only way a user can find the failing statement.
#pragma once
#include <string>

#include "core/error.h"

namespace tessera::tokenizer::jinja {

class TemplateError : public tessera::Error {
 public:
  // `raised_by_template` is true for raise_exception(): the message is the template author's text
  // (e.g. "Conversation roles must alternate"), which a server should pass on to the client as is.
  // `origin` names the template in what(): "chat template", or the file it came from.
  TemplateError(std::string message, int line, bool raised_by_template = false,
                const std::string& origin = "chat template")
      : tessera::Error(ErrorKind::kInvalidArgument, origin + ", line " + std::to_string(line) + ": " + message),
        message_(std::move(message)),
        line_(line),
        raised_by_template_(raised_by_template) {}
  const std::string& message() const { return message_; }
  int line() const { return line_; }
  bool raised_by_template() const { return raised_by_template_; }

 private:
  std::string message_;
  int line_;
  bool raised_by_template_;
};

// Thrown by value operations that do not know the template line; the interpreter catches it at the node
// being evaluated and rethrows a TemplateError with that node's line.
class ValueError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace tessera::tokenizer::jinja
