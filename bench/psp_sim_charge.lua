-- wrk script: every request a new charge with its own idempotency key.
local counter = 0
local thread_id = 0
local threads = {}

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

function init(args)
  thread_id = tid
end

function request()
  counter = counter + 1
  local key = "bench-" .. thread_id .. "-" .. counter
  local body = "amount=1000&currency=eur&payment_method=pm_card_visa&confirm=true" ..
               "&off_session=true&metadata%5Bpayment_attempt_id%5D=" .. key
  return wrk.format("POST", "/v1/payment_intents", {
    ["Authorization"] = "Bearer sk_test_bench",
    ["Idempotency-Key"] = key,
    ["Content-Type"] = "application/x-www-form-urlencoded",
  }, body)
end
