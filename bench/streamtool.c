/* streamtool.c: the two ends of the stream-scale benchmark (bench/streams.py), in C so that
 * neither is the bottleneck when thousands of mostly idle streams pass through one worker.
 *
 *   cc -O2 -o /tmp/streamtool bench/streamtool.c
 *   streamtool upstream PORT INTERVAL_MS
 *       An OpenAI-compatible streaming upstream: every POST is answered with an SSE stream of
 *       N content chunks (N = the body's "max_tokens" or "max_completion_tokens", default
 *       100), the first at once, the next INTERVAL_MS apart, then a finish chunk, a usage
 *       chunk (prompt_tokens 10, completion_tokens N) and [DONE]. Keep-alive; one epoll loop.
 *   streamtool client PORT STREAMS RATE_PER_S AUTH MODEL MAX_TOKENS TIMEOUT_S
 *       Opens STREAMS connections to 127.0.0.1:PORT at RATE_PER_S, each POSTing one
 *       streaming chat completion to /v1/chat/completions; reads each to [DONE]. Prints one
 *       JSON line: per-stream time to first event (from the request's send), duration,
 *       events, status; peak concurrent open streams; its own CPU.
 *   streamtool relay LISTEN_PORT UPSTREAM_PORT [scan]
 *       The least a gateway can do per chunk, for a floor to set the gateway's CPU against:
 *       for each accepted connection, read one request (head + content-length body), open a
 *       fresh TCP connection to 127.0.0.1:UPSTREAM_PORT (no pool), write the request to it
 *       unchanged, then relay bytes both ways as they come: one recv and one send per
 *       upstream read, level-triggered so that one readiness wakes one recv (no second recv
 *       to see EAGAIN); a short send keeps the rest and stops reading upstream until the
 *       client drains it. No response parsing: streamtool client sends one request per
 *       connection and closes it once it has read [DONE], so the relay closes the pair when
 *       either side closes (after flushing what the upstream sent last). With "scan", each
 *       upstream read is also searched for SSE event boundaries ("\n\n", memmem), counted.
 *       SIGUSR1 prints one JSON line of cumulative counters (system calls, reads, bytes,
 *       events, streams) and its own CPU to stdout.
 *
 * Linux only (epoll). Latencies in microseconds.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void nonblock(int fd) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* ------------------------------------------------------------------ output buffers */

typedef struct {
    char *data;
    size_t len, cap;
} buf_t;

static void buf_add(buf_t *b, const char *p, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 256;
        b->data = realloc(b->data, b->cap);
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

/* Send what is buffered; 0 on success (maybe partial: the rest stays), -1 on error. */
static int buf_flush(int fd, buf_t *b) {
    while (b->len) {
        ssize_t n = send(fd, b->data, b->len, MSG_NOSIGNAL);
        if (n < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
        memmove(b->data, b->data + n, b->len - (size_t)n);
        b->len -= (size_t)n;
    }
    return 0;
}

/* ------------------------------------------------------------------ upstream */

typedef struct {
    int fd;
    buf_t in, out;
    int streaming;     /* 1 while an answer is being streamed */
    int sent, total;   /* content chunks sent / to send */
    int64_t next_us;   /* when the next chunk is due */
    int want_out;      /* EPOLLOUT registered */
} up_conn;

#define MAXFD 65536
static up_conn *up_conns[MAXFD];
static int up_epfd;

static void up_close(up_conn *c) {
    epoll_ctl(up_epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    up_conns[c->fd] = NULL;
    free(c->in.data);
    free(c->out.data);
    free(c);
}

static void chunk(buf_t *b, const char *data, size_t n) {
    char head[32];
    int h = snprintf(head, sizeof head, "%zx\r\n", n);
    buf_add(b, head, (size_t)h);
    buf_add(b, data, n);
    buf_add(b, "\r\n", 2);
}

static void event(buf_t *b, const char *json) {
    char ev[1024];
    int n = snprintf(ev, sizeof ev, "data: %s\n\n", json);
    chunk(b, ev, (size_t)n);
}

static const char *CHUNK_HEAD =
    "{\"id\":\"chatcmpl-streamtool\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
    "\"model\":\"streamtool\",\"choices\":[{\"index\":0,\"delta\":";

static void send_next(up_conn *c) {
    char json[768];
    if (c->sent == 0)
        snprintf(json, sizeof json, "%s{\"role\":\"assistant\",\"content\":\"w\"},\"finish_reason\":null}]}",
                 CHUNK_HEAD);
    else
        snprintf(json, sizeof json, "%s{\"content\":\" w\"},\"finish_reason\":null}]}", CHUNK_HEAD);
    event(&c->out, json);
    c->sent++;
    if (c->sent == c->total) {
        snprintf(json, sizeof json, "%s{},\"finish_reason\":\"stop\"}]}", CHUNK_HEAD);
        event(&c->out, json);
        snprintf(json, sizeof json,
                 "{\"id\":\"chatcmpl-streamtool\",\"object\":\"chat.completion.chunk\","
                 "\"created\":1700000000,\"model\":\"streamtool\",\"choices\":[],\"usage\":"
                 "{\"prompt_tokens\":10,\"completion_tokens\":%d,\"total_tokens\":%d}}",
                 c->total, c->total + 10);
        event(&c->out, json);
        event(&c->out, "[DONE]");
        buf_add(&c->out, "0\r\n\r\n", 5);
        c->streaming = 0;
    }
}

static int json_int(const char *body, size_t len, const char *name) {
    char *p = memmem(body, len, name, strlen(name));
    if (!p) return -1;
    p += strlen(name);
    while (*p == ' ' || *p == ':' || *p == '"') p++;
    return atoi(p);
}

/* Does data hold a whole request (head + content-length body)? Its head's and body's sizes. */
static int request_complete(const char *data, size_t len, size_t *head, long *body) {
    const char *end = memmem(data, len, "\r\n\r\n", 4);
    if (!end) return 0;
    *head = (size_t)(end - data) + 4;
    *body = 0;
    for (const char *p = data; p < end; p++) {
        if ((*p == 'c' || *p == 'C') && strncasecmp(p, "content-length:", 15) == 0) {
            *body = atol(p + 15);
            break;
        }
    }
    return len >= *head + (size_t)*body;
}

/* A request complete in c->in? Start its stream. */
static void up_parse(up_conn *c, int64_t now) {
    if (c->streaming || c->in.len == 0) return;
    size_t head;
    long body;
    if (!request_complete(c->in.data, c->in.len, &head, &body)) return;
    int n = json_int(c->in.data + head, (size_t)body, "\"max_completion_tokens\"");
    if (n <= 0) n = json_int(c->in.data + head, (size_t)body, "\"max_tokens\"");
    if (n <= 0) n = 100;
    memmove(c->in.data, c->in.data + head + body, c->in.len - head - (size_t)body);
    c->in.len -= head + (size_t)body;
    static const char *resp =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
        "transfer-encoding: chunked\r\n\r\n";
    buf_add(&c->out, resp, strlen(resp));
    c->streaming = 1;
    c->sent = 0;
    c->total = n;
    send_next(c);
    c->next_us = now;
}

static void up_want_out(up_conn *c) {
    int want = c->out.len > 0;
    if (want == c->want_out) return;
    struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.fd = c->fd};
    epoll_ctl(up_epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->want_out = want;
}

/* A non-blocking listening socket on 127.0.0.1:PORT (the upstream's and the relay's). */
static int listen_loopback(int port) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0) die("bind");
    if (listen(ls, 8192) < 0) die("listen");
    nonblock(ls);
    return ls;
}

static int run_upstream(int port, double interval_ms) {
    int64_t interval = (int64_t)(interval_ms * 1000);
    int ls = listen_loopback(port);
    up_epfd = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls};
    epoll_ctl(up_epfd, EPOLL_CTL_ADD, ls, &ev);
    struct epoll_event evs[512];
    int maxfd = 0;
    for (;;) {
        int n = epoll_wait(up_epfd, evs, 512, 1);
        int64_t now = now_us();
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == ls) {
                int cfd;
                while ((cfd = accept(ls, NULL, NULL)) >= 0) {
                    if (cfd >= MAXFD) { close(cfd); continue; }
                    nonblock(cfd);
                    up_conn *c = calloc(1, sizeof *c);
                    c->fd = cfd;
                    up_conns[cfd] = c;
                    if (cfd > maxfd) maxfd = cfd;
                    struct epoll_event cev = {.events = EPOLLIN, .data.fd = cfd};
                    epoll_ctl(up_epfd, EPOLL_CTL_ADD, cfd, &cev);
                }
                continue;
            }
            up_conn *c = up_conns[fd];
            if (!c) continue;
            if (evs[i].events & EPOLLIN) {
                char tmp[16384];
                ssize_t r;
                int closed = 0;
                while ((r = recv(fd, tmp, sizeof tmp, 0)) > 0) buf_add(&c->in, tmp, (size_t)r);
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) closed = 1;
                if (closed) { up_close(c); continue; }
                up_parse(c, now);
            }
            if (buf_flush(fd, &c->out) < 0) { up_close(c); continue; }
            up_want_out(c);
        }
        /* The chunks that are due. */
        for (int fd = 0; fd <= maxfd; fd++) {
            up_conn *c = up_conns[fd];
            if (!c || !c->streaming || c->next_us + interval > now) continue;
            c->next_us += interval;
            send_next(c);
            if (!c->streaming) up_parse(c, now); /* a pipelined next request */
            if (buf_flush(fd, &c->out) < 0) { up_close(c); continue; }
            up_want_out(c);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ client */

typedef struct {
    int fd;
    buf_t out;
    int64_t start_us, sent_us, first_us, done_us;
    int status, events, done, failed;
    char carry[8];
    int carry_len;
    int head_done;
    char head[8192];
    int head_len;
} cl_stream;

static int cmp64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int64_t pct(int64_t *v, int n, double q) {
    if (!n) return -1;
    int i = (int)(q * (n - 1) + 0.5);
    return v[i];
}

/* Count "data: " in a byte stream, across reads (a carry of the last 5 bytes). */
static void count_events(cl_stream *s, const char *p, size_t n, int64_t now) {
    char tmp[16384 + 8];
    memcpy(tmp, s->carry, (size_t)s->carry_len);
    memcpy(tmp + s->carry_len, p, n);
    size_t len = (size_t)s->carry_len + n;
    const char *q = tmp, *end = tmp + len;
    while ((q = memmem(q, (size_t)(end - q), "data: ", 6)) != NULL) {
        if (!s->events) s->first_us = now;
        s->events++;
        q += 6;
    }
    if (memmem(tmp, len, "[DONE]", 6)) s->done = 1;
    s->carry_len = len < 7 ? (int)len : 7;
    memcpy(s->carry, end - s->carry_len, (size_t)s->carry_len);
}

static int run_client(int port, int streams, double rate, const char *auth, const char *model,
                      int max_tokens, double timeout_s) {
    int ep = epoll_create1(0);
    cl_stream *ss = calloc((size_t)streams, sizeof *ss);
    char body[512];
    int blen = 0;
    char req[2048];
    int opened = 0, finished = 0, open_now = 0, peak = 0;
    int64_t t0 = now_us(), deadline = t0 + (int64_t)(timeout_s * 1e6);
    struct epoll_event evs[512];
    while (finished < streams && now_us() < deadline) {
        int64_t now = now_us();
        /* Open the streams that are due at RATE_PER_S. */
        while (opened < streams && (double)(now - t0) >= opened * 1e6 / rate) {
            cl_stream *s = &ss[opened];
            s->fd = socket(AF_INET, SOCK_STREAM, 0);
            nonblock(s->fd);
            struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            s->start_us = now;
            connect(s->fd, (struct sockaddr *)&a, sizeof a);
            blen = snprintf(body, sizeof body,
                            "{\"model\":\"%s\",\"max_tokens\":%d,\"stream\":true,\"stream_options\":"
                            "{\"include_usage\":true},\"user\":\"bench-customer\",\"messages\":"
                            "[{\"role\":\"user\",\"content\":\"stream %d of a scale run\"}]}",
                            model, max_tokens, opened);
            int rlen = snprintf(req, sizeof req,
                                "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                                "authorization: %s\r\ncontent-type: application/json\r\n"
                                "content-length: %d\r\n\r\n%s", auth, blen, body);
            buf_add(&s->out, req, (size_t)rlen);
            struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u32 = (uint32_t)opened};
            epoll_ctl(ep, EPOLL_CTL_ADD, s->fd, &ev);
            opened++;
            open_now++;
            if (open_now > peak) peak = open_now;
        }
        int n = epoll_wait(ep, evs, 512, 1);
        now = now_us();
        for (int i = 0; i < n; i++) {
            cl_stream *s = &ss[evs[i].data.u32];
            if (s->done || s->failed) continue;
            if ((evs[i].events & EPOLLOUT) && s->out.len) {
                if (buf_flush(s->fd, &s->out) < 0) { s->failed = 1; }
                if (!s->out.len) {
                    s->sent_us = now;
                    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = evs[i].data.u32};
                    epoll_ctl(ep, EPOLL_CTL_MOD, s->fd, &ev);
                }
            }
            if (!s->failed && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
                char tmp[16384];
                ssize_t r;
                while ((r = recv(s->fd, tmp, sizeof tmp, 0)) > 0) {
                    const char *p = tmp;
                    size_t len = (size_t)r;
                    if (!s->head_done) {
                        size_t take = len < sizeof s->head - 1 - (size_t)s->head_len
                                          ? len : sizeof s->head - 1 - (size_t)s->head_len;
                        memcpy(s->head + s->head_len, p, take);
                        s->head_len += (int)take;
                        s->head[s->head_len] = 0;
                        char *e = strstr(s->head, "\r\n\r\n");
                        if (!e) continue;
                        s->status = atoi(s->head + 9);
                        s->head_done = 1;
                        size_t used = (size_t)(e + 4 - s->head) - ((size_t)s->head_len - take);
                        p += used;
                        len -= used;
                    }
                    count_events(s, p, len, now);
                    if (s->done) break;
                }
                if (!s->done && (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)))
                    s->failed = 1;
            }
            if (s->done || s->failed) {
                s->done_us = now;
                epoll_ctl(ep, EPOLL_CTL_DEL, s->fd, NULL);
                close(s->fd);
                finished++;
                open_now--;
            }
        }
    }
    int64_t elapsed = now_us() - t0;
    int64_t *ttft = calloc((size_t)streams, sizeof *ttft), *dur = calloc((size_t)streams, sizeof *dur);
    int ok = 0, failed = 0, bad_status = 0, unfinished = 0;
    long events = 0;
    int64_t first_sent = -1, last_done = 0;
    for (int i = 0; i < streams; i++) {
        cl_stream *s = &ss[i];
        if (i >= opened || (!s->done && !s->failed)) { unfinished++; continue; }
        if (s->failed) { failed++; continue; }
        if (s->status != 200) { bad_status++; continue; }
        ttft[ok] = s->first_us - s->sent_us;
        dur[ok] = s->done_us - s->sent_us;
        events += s->events;
        if (first_sent < 0 || s->sent_us < first_sent) first_sent = s->sent_us;
        if (s->done_us > last_done) last_done = s->done_us;
        ok++;
    }
    qsort(ttft, (size_t)ok, sizeof *ttft, cmp64);
    qsort(dur, (size_t)ok, sizeof *dur, cmp64);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu_s = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
                   ru.ru_stime.tv_usec / 1e6;
    printf("{\"streams\":%d,\"opened\":%d,\"ok\":%d,\"failed\":%d,\"bad_status\":%d,"
           "\"unfinished\":%d,\"events\":%ld,\"peak_open\":%d,\"elapsed_us\":%lld,"
           "\"ttft_us\":{\"p50\":%lld,\"p90\":%lld,\"p99\":%lld,\"max\":%lld},"
           "\"duration_us\":{\"p50\":%lld,\"p99\":%lld,\"max\":%lld},\"client_cpu_s\":%.3f}\n",
           streams, opened, ok, failed, bad_status, unfinished, events, peak,
           (long long)elapsed, (long long)pct(ttft, ok, 0.5), (long long)pct(ttft, ok, 0.9),
           (long long)pct(ttft, ok, 0.99), (long long)pct(ttft, ok, 1.0),
           (long long)pct(dur, ok, 0.5), (long long)pct(dur, ok, 0.99),
           (long long)pct(dur, ok, 1.0), cpu_s);
    return 0;
}

/* ------------------------------------------------------------------ relay */

/* One client connection and the upstream connection opened for it. */
typedef struct {
    int cfd, ufd;        /* ufd -1 until the request is complete */
    buf_t req;           /* the request, until it is complete */
    buf_t to_c, to_u;    /* what a short send left for each side */
    uint32_t cev, uev;   /* the events registered for each fd */
    int up_eof;          /* the upstream closed: close the client once to_c is flushed */
    char carry;          /* scan: the last byte of the previous upstream read */
} rl_pair;

static rl_pair *rl_by_fd[MAXFD];
static uint32_t rl_gen[MAXFD];   /* a registration's generation, against stale events */
static int rl_epfd, rl_scan;
static volatile sig_atomic_t rl_report;
static struct {
    long epoll_waits, recvs, sends, ctls, accepts, connects, closes;
    long up_reads, up_bytes, short_sends, sse_events, streams, failed;
} rl;

static void rl_usr1(int sig) { (void)sig; rl_report = 1; }

static void rl_set(int fd, uint32_t *cur, uint32_t want, int op) {
    if (op == EPOLL_CTL_MOD && *cur == want) return;
    struct epoll_event ev = {.events = want, .data.u64 = ((uint64_t)rl_gen[fd] << 32) | (uint32_t)fd};
    epoll_ctl(rl_epfd, op, fd, &ev);
    rl.ctls++;
    *cur = want;
}

static void rl_close(rl_pair *p) {
    /* close() removes an fd from the epoll set (no epoll_ctl DEL needed: no dup'ed fds). */
    close(p->cfd);
    rl_by_fd[p->cfd] = NULL;
    rl_gen[p->cfd]++;
    rl.closes++;
    if (p->ufd >= 0) {
        close(p->ufd);
        rl_by_fd[p->ufd] = NULL;
        rl_gen[p->ufd]++;
        rl.closes++;
    }
    free(p->req.data);
    free(p->to_c.data);
    free(p->to_u.data);
    free(p);
}

/* Send n bytes (after whatever is already waiting) to fd; 0 or -1 on error. */
static int rl_send(int fd, buf_t *pending, const char *data, size_t n) {
    if (pending->len) {
        buf_add(pending, data, n);
        return 0;
    }
    rl.sends++;
    ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        w = 0;
    }
    if ((size_t)w < n) {
        rl.short_sends++;
        buf_add(pending, data + w, n - (size_t)w);
    }
    return 0;
}

static int rl_flush(int fd, buf_t *b) {
    if (!b->len) return 0;
    rl.sends++;
    return buf_flush(fd, b);
}

/* Register what each side waits for: the client is read (for its close, or bytes for the
 * upstream) unless the upstream has its last bytes to take, and written when to_c holds
 * bytes; the upstream is read only while to_c is empty (back-pressure), and written while
 * it connects or to_u holds bytes. */
static void rl_arm(rl_pair *p) {
    rl_set(p->cfd, &p->cev, EPOLLIN | (p->to_c.len ? EPOLLOUT : 0), EPOLL_CTL_MOD);
    if (p->ufd >= 0)
        rl_set(p->ufd, &p->uev, (p->to_c.len || p->up_eof ? 0 : EPOLLIN)
               | (p->to_u.len ? EPOLLOUT : 0), EPOLL_CTL_MOD);
}

/* The request in p->req complete? Open the upstream connection and hand it over. */
static int rl_request(rl_pair *p, int port) {
    size_t head;
    long body;
    if (!request_complete(p->req.data, p->req.len, &head, &body)) return 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || fd >= MAXFD) {
        if (fd >= 0) close(fd);
        return -1;
    }
    nonblock(fd);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    rl.connects++;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    p->ufd = fd;
    rl_by_fd[fd] = p;
    p->to_u = p->req; /* sent once connected (EPOLLOUT), unchanged, with anything after it */
    p->req = (buf_t){0};
    rl_set(fd, &p->uev, EPOLLIN | EPOLLOUT, EPOLL_CTL_ADD);
    rl.streams++;
    return 0;
}

static void rl_print(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("{\"epoll_waits\":%ld,\"recvs\":%ld,\"sends\":%ld,\"epoll_ctls\":%ld,\"accepts\":%ld,"
           "\"connects\":%ld,\"closes\":%ld,\"up_reads\":%ld,\"up_bytes\":%ld,"
           "\"short_sends\":%ld,\"sse_events\":%ld,\"streams\":%ld,\"failed\":%ld,"
           "\"user_s\":%.6f,\"sys_s\":%.6f}\n",
           rl.epoll_waits, rl.recvs, rl.sends, rl.ctls, rl.accepts, rl.connects, rl.closes,
           rl.up_reads, rl.up_bytes, rl.short_sends, rl.sse_events, rl.streams, rl.failed,
           ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6,
           ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
    fflush(stdout);
}

static int run_relay(int port, int up_port) {
    signal(SIGUSR1, rl_usr1);
    int ls = listen_loopback(port);
    rl_epfd = epoll_create1(0);
    struct epoll_event lev = {.events = EPOLLIN, .data.u64 = (uint32_t)ls};
    epoll_ctl(rl_epfd, EPOLL_CTL_ADD, ls, &lev);
    struct epoll_event evs[512];
    char tmp[16384];
    for (;;) {
        if (rl_report) {
            rl_report = 0;
            rl_print();
        }
        int n = epoll_wait(rl_epfd, evs, 512, -1);
        rl.epoll_waits++;
        for (int i = 0; i < n; i++) {
            int fd = (int)(uint32_t)evs[i].data.u64;
            uint32_t e = evs[i].events;
            if (fd == ls) {
                int cfd;
                while ((rl.accepts++, cfd = accept(ls, NULL, NULL)) >= 0) {
                    if (cfd >= MAXFD) { close(cfd); continue; }
                    nonblock(cfd);
                    rl_pair *p = calloc(1, sizeof *p);
                    p->cfd = cfd;
                    p->ufd = -1;
                    rl_by_fd[cfd] = p;
                    rl_set(cfd, &p->cev, EPOLLIN, EPOLL_CTL_ADD);
                }
                continue;
            }
            rl_pair *p = rl_by_fd[fd];
            if (!p || (uint32_t)(evs[i].data.u64 >> 32) != rl_gen[fd]) continue; /* stale */
            int fail = 0;
            if (fd == p->ufd) {
                if ((e & EPOLLOUT) && rl_flush(fd, &p->to_u) < 0) fail = 1;
                if (!fail && (e & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !p->to_c.len) {
                    rl.recvs++;
                    ssize_t r = recv(fd, tmp, sizeof tmp, 0);
                    if (r > 0) {
                        rl.up_reads++;
                        rl.up_bytes += r;
                        if (rl_scan) {
                            if (p->carry == '\n' && tmp[0] == '\n') rl.sse_events++;
                            for (const char *q = tmp, *end = tmp + r;
                                 (q = memmem(q, (size_t)(end - q), "\n\n", 2)) != NULL; q += 2)
                                rl.sse_events++;
                            p->carry = tmp[r - 1];
                        }
                        if (rl_send(p->cfd, &p->to_c, tmp, (size_t)r) < 0) fail = 1;
                    } else if (r == 0) {
                        p->up_eof = 1;
                    } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
                        fail = 1;
                    }
                }
                if (!fail && p->up_eof && !p->to_c.len) fail = 1; /* all relayed: done */
            } else {
                if ((e & EPOLLOUT) && rl_flush(fd, &p->to_c) < 0) fail = 1;
                if (!fail && p->up_eof && !p->to_c.len) fail = 1;
                if (!fail && (e & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
                    rl.recvs++;
                    ssize_t r = recv(fd, tmp, sizeof tmp, 0);
                    if (r > 0) {
                        if (p->ufd >= 0) {
                            if (rl_send(p->ufd, &p->to_u, tmp, (size_t)r) < 0) fail = 1;
                        } else {
                            buf_add(&p->req, tmp, (size_t)r);
                            if (rl_request(p, up_port) < 0) { fail = 1; rl.failed++; }
                        }
                    } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                        fail = 1; /* the client is done (after [DONE]) or gone */
                    }
                }
            }
            if (fail) rl_close(p);
            else rl_arm(p);
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    struct rlimit rl = {MAXFD, MAXFD};
    setrlimit(RLIMIT_NOFILE, &rl);
    if (argc == 4 && strcmp(argv[1], "upstream") == 0)
        return run_upstream(atoi(argv[2]), atof(argv[3]));
    if (argc == 9 && strcmp(argv[1], "client") == 0)
        return run_client(atoi(argv[2]), atoi(argv[3]), atof(argv[4]), argv[5], argv[6],
                          atoi(argv[7]), atof(argv[8]));
    if ((argc == 4 || (argc == 5 && strcmp(argv[4], "scan") == 0)) &&
        strcmp(argv[1], "relay") == 0) {
        rl_scan = argc == 5;
        return run_relay(atoi(argv[2]), atoi(argv[3]));
    }
    fprintf(stderr,
            "usage: %s upstream PORT INTERVAL_MS\n"
            "       %s client PORT STREAMS RATE_PER_S AUTH MODEL MAX_TOKENS TIMEOUT_S\n"
            "       %s relay LISTEN_PORT UPSTREAM_PORT [scan]\n",
            argv[0], argv[0], argv[0]);
    return 2;
}
